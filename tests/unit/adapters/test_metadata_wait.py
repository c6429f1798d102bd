"""A broker that takes connections before it serves them (tansu restarted on its --data storage) fails a metadata
request at once: `tierflow up` must keep asking until its timeout, then say so in one line."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pipeline.adapters.kafka import make_admin, metadata
from pipeline.errors import ServiceUnavailable
from pipeline.settings import Settings


def test_metadata_keeps_asking_a_broker_that_drops_connections_then_says_why() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def accept_and_drop() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except TimeoutError:
                pass

    t = threading.Thread(target=accept_and_drop, daemon=True)
    t.start()
    try:
        admin = make_admin(Settings(kafka_bootstrap=f"127.0.0.1:{port}"))
        t0 = time.monotonic()
        with pytest.raises(ServiceUnavailable) as e:
            metadata(admin, 2.0)
        waited = time.monotonic() - t0
    finally:
        stop.set()
        t.join(2)
        server.close()
    assert waited >= 1.9, f"gave up after {waited:.2f} s: a broker still starting would have failed `tierflow up`"
    assert "\n" not in str(e.value) and "within 2 s" in str(e.value), str(e.value)

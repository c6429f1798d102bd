"""`ring_once`: `tierflow send`'s doorbell, rung without redis-py, against a stand-in Redis on a socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from pipeline.adapters.doorbell import resp_command, ring_once
from pipeline.settings import Settings


@contextmanager
def fake_redis(replies: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """A one-connection server on a free port: reads until one reply per expected command is due, sends the replies
    and keeps what it read."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while data.count(b"*") < len(replies):  # one array per command (the test's payloads hold no '*')
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            got.append(data)
            conn.sendall(b"".join(replies))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], got
    finally:
        thread.join(5)
        server.close()


def settings_at(url: str) -> Settings:
    return Settings().updated(redis_url=url, redis_prefix="t:")


def test_it_publishes_on_each_topics_doorbell() -> None:
    with fake_redis([b":1\r\n", b":0\r\n"]) as (port, got):
        ring_once(settings_at(f"redis://127.0.0.1:{port}/3"), ["tierflow.requests", "tierflow.tier.light"])
    assert got == [resp_command([b"PUBLISH", b"t:wake:tierflow.requests", b""])
                   + resp_command([b"PUBLISH", b"t:wake:tierflow.tier.light", b""])]


def test_a_password_in_the_url_authenticates_first() -> None:
    with fake_redis([b"+OK\r\n", b":1\r\n"]) as (port, got):
        ring_once(settings_at(f"redis://:p%40ss@127.0.0.1:{port}/0"), ["x"])
    assert got == [resp_command([b"AUTH", b"p@ss"]) + resp_command([b"PUBLISH", b"t:wake:x", b""])]


def test_the_bytes_are_redis_pys() -> None:
    packed = b"".join(redis.connection.Connection().pack_command("PUBLISH", "t:wake:x", b""))
    assert resp_command([b"PUBLISH", b"t:wake:x", b""]) == packed


def test_an_error_reply_or_no_redis_is_not_raised() -> None:
    with fake_redis([b"-WRONGPASS invalid username-password pair\r\n", b"-NOAUTH\r\n"]) as (port, _):
        ring_once(settings_at(f"redis://:bad@127.0.0.1:{port}/0"), ["x"])
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    ring_once(settings_at(f"redis://127.0.0.1:{port}/0"), ["x"])  # connection refused: a lost hint, no error

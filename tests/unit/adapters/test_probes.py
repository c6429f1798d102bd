"""/ready and /metrics of a tierflow process, over real HTTP (pipeline/adapters/probes.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from pipeline.adapters.probes import Readiness, start
from pipeline.ops.devstack import free_port


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_ready_says_503_and_what_is_missing_until_every_check_holds_while_metrics_answer_throughout() -> None:
    registry = CollectorRegistry()
    Counter("probe_test_total", "a counter", registry=registry).inc()
    readiness = Readiness()
    port = free_port()
    server = start(port, registry, readiness, addr="127.0.0.1")
    try:
        # nothing registered yet: still importing, or building the model
        code, body = _get(port, "/ready")
        assert code == 503 and json.loads(body) == {"ready": False, "checks": {"started": False}}
        code, body = _get(port, "/metrics")  # alive before ready: the liveness probe
        assert code == 200 and b"probe_test_total 1.0" in body

        state = {"model_warm": True, "partitions_assigned": False}
        readiness.require(lambda: dict(state))
        code, body = _get(port, "/ready")
        assert code == 503 and json.loads(body)["checks"] == state

        state["partitions_assigned"] = True
        code, body = _get(port, "/ready")
        doc = json.loads(body)
        assert code == 200 and doc["ready"] and doc["ready_after_s"] >= 0
        # Prometheus's own path, and any other a scrape config names, still get the metrics
        assert b"probe_test_total" in _get(port, "/")[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_released_source_no_longer_counts() -> None:
    readiness = Readiness()

    def stuck() -> dict[str, bool]:
        return {"partitions_assigned": False}

    readiness.require(stuck)
    readiness.require(lambda: {"model_warm": True})
    assert not readiness.report()["ready"]
    readiness.release(stuck)
    doc = readiness.report()
    assert doc["ready"] and doc["checks"] == {"model_warm": True}

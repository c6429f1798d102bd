"""The HTTP side of a tierflow process: `/metrics` (Prometheus; also the liveness probe) and `/ready`.

`/metrics` answers as soon as the process has started: it says the process is alive, nothing more (a heavy
worker's answered seconds before its model was loaded). `/ready` answers 200 only once every check the process
registered holds (a worker: model loaded and warmed up, partitions assigned), else 503; both with a JSON body
that names each check, so `curl :9100/ready` says what is still missing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

Checks = Callable[[], dict[str, bool]]
READY_PATH = "/ready"


class Readiness:
    """What this process must have done before it is ready: named checks, read on each request."""

    def __init__(self) -> None:
        self._sources: list[Checks] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._ready_after_s: float | None = None

    def require(self, checks: Checks) -> None:
        """Add a source of checks (called on every /ready request and heartbeat: keep it a few attribute reads)."""
        with self._lock:
            self._sources.append(checks)

    def release(self, checks: Checks) -> None:
        """Drop a source (its agent stopped; an in-process test must not keep every agent it ran alive)."""
        with self._lock:
            self._sources = [c for c in self._sources if c != checks]

    def report(self) -> dict[str, Any]:
        with self._lock:
            sources = list(self._sources)
        checks: dict[str, bool] = {}
        for source in sources:
            checks.update(source())
        # Nothing registered yet: the process is still importing or building its model.
        ready = bool(checks) and all(checks.values())
        if ready and self._ready_after_s is None:
            self._ready_after_s = round(time.monotonic() - self._t0, 2)
        out: dict[str, Any] = {"ready": ready, "checks": checks or {"started": False}}
        if self._ready_after_s is not None:
            out["ready_after_s"] = self._ready_after_s
        return out


READINESS = Readiness()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a probe every few seconds is not news
        pass


def app(registry: CollectorRegistry, readiness: Readiness) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: /ready from `readiness`, every other path the metrics of `registry` (as prometheus_client's
    own server does, so a scrape config with another path keeps working)."""
    metrics_app = make_wsgi_app(registry)

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") == READY_PATH:
            body = readiness.report()
            start_response("200 OK" if body["ready"] else "503 Service Unavailable",
                           [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        return metrics_app(environ, start_response)

    return serve


def start(port: int, registry: CollectorRegistry, readiness: Readiness = READINESS, addr: str = "") -> _Server:
    """Serve /metrics and /ready on `port` from a daemon thread. Raises OSError when the port is taken."""
    server = make_server(addr, port, app(registry, readiness), server_class=_Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server

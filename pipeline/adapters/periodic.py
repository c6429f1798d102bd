"""One background-thread shape for every agent: call a function every N seconds until closed.

The heartbeat writer, ingest's health monitor and the threshold cache's refresher all run on it. An exception
from the function is logged (rate-limited) and the thread goes on: a background refresher that dies silently
leaves its agent steering by values that never change again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0  # at most one traceback per thread in this many seconds: a fault repeating 4 times a second


class Periodic:
    """A daemon thread that calls `fn()` every `interval_s` seconds (the first call one interval after `start`),
    until `close()`.

    `interval_s` 0 calls `fn` back to back: for a function that blocks for a bounded time of its own (a pub/sub
    read with a timeout). A function that waits for anything else waits on `stopping`, so `close()` is prompt.
    `on_exit` runs in the thread once the loop ends (to release what `fn` holds, e.g. a subscription).
    """

    def __init__(self, name: str, interval_s: float, fn: Callable[[], object],
                 on_exit: Callable[[], object] | None = None) -> None:
        self.name, self.interval_s, self.fn, self.on_exit = name, interval_s, fn, on_exit
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._last_log = -LOG_EVERY_S

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the calls and wait up to `timeout_s` for a call in progress to end.

        Bounded: a call stuck on a stalled Redis (agents' clients time out after 2 s) must not hold an agent's
        shutdown; the thread is a daemon, so one still running then never keeps the process alive.
        """
        self.stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self.stopping.wait(self.interval_s):
                try:
                    self.fn()
                except Exception:  # noqa: BLE001 - a background refresher must outlive a bad call
                    self._log_failure()
        finally:
            if self.on_exit is not None:
                try:
                    self.on_exit()
                except Exception:
                    log.exception("%s: cleanup failed", self.name)

    def _log_failure(self) -> None:
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.exception("%s: background call failed; calling again in %.2gs", self.name, self.interval_s)

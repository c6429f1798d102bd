"""When a loop may take a backfill batch: live traffic first, backfill within a duty cycle. Pure, clock passed in."""

from __future__ import annotations

import time
from collections.abc import Callable


class BackfillGate:
    """When a loop may take a backfill batch: only while no live record waits, within a duty cycle.

    After a backfill batch that took `d` seconds the loop rests `d * (1 - duty) / duty`, and at least
    `gap_s`, before the next: backfill holds at most `duty` of the loop's time, a live record arriving
    meanwhile finds the loop free, and the broker sees a few full batches rather than many small ones.
    Where live traffic never leaves the loop idle, backfill still gets a batch every `starve_s` (and its
    consumer stays polled, so it keeps its group membership).
    """

    def __init__(self, duty: float, gap_s: float = 0.0, starve_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.duty, self.gap_s, self.starve_s, self._clock = duty, gap_s, starve_s, clock
        self._next = 0.0  # earliest start of the next backfill batch
        self._last = clock()  # the last backfill turn, found records or not
        self.active = False  # the last turn found records: more are probably waiting

    def due(self, live_waiting: bool) -> bool:
        now = self._clock()
        if now < self._next:
            return False
        return not live_waiting or now - self._last >= self.starve_s

    def done(self, started: float, records: int) -> None:
        """A backfill turn that began at `started` (this gate's clock) took `records` records."""
        now = self._clock()
        self._last, self.active = now, records > 0
        rest = (now - started) * (1.0 - self.duty) / self.duty if records else 0.0
        self._next = now + max(self.gap_s, rest)

    def idle_wait_s(self, idle_s: float) -> float:
        """How long to block waiting for live records: no later than the next backfill turn while one is under way."""
        if not self.active:
            return idle_s
        return min(idle_s, max(0.001, self._next - self._clock()))

    def now(self) -> float:
        return self._clock()

"""Pacing a replay: how fast recorded requests go out, and how the rate yields to live traffic.

Pure: the guard reads live latency through a callable (the replay job passes the workers' heartbeats from
Redis) and sleeps through an injectable clock, so every decision is tested without a broker or Redis
(tests/unit/agents/test_replay_guard.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("pipeline.agents.replay")  # the replay job's log, where operators look for its pacing

CHUNK = 500  # records at most between flush + progress save
CHUNK_S = 0.1  # a paced replay sends this many seconds' worth of records at a time

TierLatency = dict[str, tuple[float, int]]  # tier -> (recent live p95 ms, recent live answers)


class Pacer:
    """Paces records at `rate` msg/s (None: no limit); the rate may change between chunks.

    Records go out in chunks of about CHUNK_S seconds' worth, each followed by a sleep: a paced replay
    reaches the pipeline as a few even batches a second, and costs a sleep per chunk, not per record.
    """

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._next = time.monotonic()

    def chunk_size(self) -> int:
        return CHUNK if not self.rate else max(1, min(CHUNK, int(self.rate * CHUNK_S)))

    def wait(self, n: int) -> None:
        """Sleep until `n` more records are due."""
        if not self.rate:
            return
        now = time.monotonic()
        self._next = max(self._next, now - CHUNK_S) + n / self.rate  # a chunk's credit for idle time, no bursts
        if self._next > now:
            time.sleep(self._next - now)


@dataclass
class RateControl:
    """A replay's rate: up by `grow` while live latency holds, down by `backoff` when it does not.

    Growth is geometric from a modest start, so a replay beside a quiet pipeline reaches the operator's
    rate in seconds, and a step is never more than half again what was last seen to be harmless.
    """

    rate: float
    floor: float
    ceiling: float
    grow: float = 1.5
    backoff: float = 0.5

    def update(self, congested: bool) -> float:
        factor = self.backoff if congested else self.grow
        self.rate = min(self.ceiling, max(self.floor, self.rate * factor))
        return self.rate


class LiveGuard:
    """Paces a replay by live latency: the backfill yields to live traffic.

    Before the replay starts, each tier's live p95 (replays excluded, from the workers' heartbeats) is
    its baseline. Then at every new heartbeat the guard reads each tier's p95 of the last couple of
    seconds (`horizon_s`): over `max_slowdown` times its baseline (and `slack_ms` over it: a p95 of a
    few tens of ms jitters by some ms) is congestion, and the rate halves; within it, the rate grows
    by half. Each change waits out one horizon since the last (a cut may follow a rise at once), since
    until then the signal still shows the rate before. The rate stays within [`min_rate`, the
    operator's `--rate`]: a replay under a busy pipeline slows down but finishes. Without live
    answers to protect (none before the replay, or a tier with too few recent answers for a p95),
    nothing holds the rate back.

    Live latency also moves for reasons of its own (more live traffic, a slower model, a broker whose
    log grows). When it stays over its limit for `probe_after` horizons after cuts, the guard pauses
    the replay for a horizon and takes what live latency is then, without the replay, as the new
    baseline: a replay is held back by the harm it does, not by a drift it cannot undo.
    """

    def __init__(self, read: Callable[[], tuple[TierLatency, float]], max_slowdown: float, max_rate: float | None,
                 *, start_rate: float = 500.0, min_rate: float = 50.0, slack_ms: float = 5.0,
                 min_answers: int = 20, interval_s: float = 0.5, horizon_s: float = 2.0, settle_s: float = 3.0,
                 probe_after: int = 2, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.read, self.max_slowdown, self.slack_ms, self.min_answers = read, max_slowdown, slack_ms, min_answers
        self.interval_s, self.horizon_s, self.clock = interval_s, horizon_s, clock
        ceiling = max_rate or 20_000.0
        self.control = RateControl(min(start_rate, ceiling), min(min_rate, ceiling), ceiling)
        # The baseline: live latency before any replayed record is sent. Live traffic that has only just begun
        # (or workers that have not beaten yet) gets `settle_s` to show up; none by then: nothing to yield to.
        deadline = clock() + settle_s
        while True:
            latency, self._seen = self._read()
            self.baseline = self._measured(latency)
            if self.baseline or clock() >= deadline:
                break
            sleep(0.25)
        self._checked = clock()
        self._changed_at = self._checked
        self._cut = False
        self.cuts = 0
        self.probe_after, self._stuck, self.probes = probe_after, 0, 0
        self._probe_until: float | None = None
        self._sleep = sleep

    def _measured(self, latency: TierLatency) -> dict[str, float]:
        """The tiers' recent live p95s that rest on enough answers to count."""
        return {t: recent for t, (recent, n) in latency.items() if recent > 0 and n >= self.min_answers}

    def _read(self) -> tuple[TierLatency, float]:
        return self.read()  # the reader answers ({}, 0.0) when it cannot read: nothing new to act on

    def limit(self, tier: str) -> float:
        """The recent live p95 (ms) above which `tier` counts as slowed down."""
        base = self.baseline[tier]
        return max(base * self.max_slowdown, base + self.slack_ms)

    def wait_rate(self) -> float:
        """The replay rate to use now, after sleeping out a pause to re-measure live latency (see `rate`)."""
        while (r := self.rate()) <= 0:
            self._sleep(self.interval_s)
        return r

    def rate(self) -> float:
        """The replay rate to use now (msg/s); 0 while paused to re-measure live latency without the replay."""
        now = self.clock()
        if self._probe_until is not None:
            if now < self._probe_until:
                return 0.0
            return self._rebaseline(now)
        if now - self._checked < self.interval_s:
            return self.control.rate
        self._checked = now
        latency, newest = self._read()
        if newest <= self._seen:  # no heartbeat since the last reading: nothing new to act on
            return self.control.rate
        self._seen = newest
        slow = any(recent > self.limit(t) for t, (recent, n) in latency.items()
                   if t in self.baseline and n >= self.min_answers)
        settled = now - self._changed_at >= self.horizon_s
        if not settled and (not slow or self._cut):
            return self.control.rate  # the signal still shows the rate before the last change
        if slow and self._cut:
            self._stuck += 1
            if self._stuck >= self.probe_after:  # cut after cut and no better: is it the replay at all?
                self._stuck = 0
                self._probe_until = now + self.horizon_s + self.interval_s
                return 0.0
        elif not slow:
            self._stuck = 0
        if slow:
            self.cuts += 1
            log.info("replay: live p95 %s ms over its limit; replay rate %.0f -> %.0f msg/s",
                     {t: round(v[0]) for t, v in latency.items() if t in self.baseline}, self.control.rate,
                     max(self.control.floor, self.control.rate * self.control.backoff))
        self._changed_at, self._cut = now, slow
        return self.control.update(slow)

    def _rebaseline(self, now: float) -> float:
        latency, self._seen = self._read()
        fresh = self._measured(latency)
        log.info("replay: live p95 without the replay now %s ms (baseline was %s ms)",
                 {t: round(v) for t, v in fresh.items()}, {t: round(v) for t, v in self.baseline.items()})
        self.baseline.update(fresh)
        self.probes += 1
        self._probe_until, self._changed_at, self._cut = None, now, False
        return self.control.rate

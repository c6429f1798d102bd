"""Worker heartbeats in Redis: each worker writes its health with a TTL; ingest reads a tier's.

Key: `<prefix>hb:<tier>:<worker_id>` -> JSON {ts, lag, p95_ms, live_p95_ms, live_recent_p95_ms,
live_recent_n, busy_ms, processed, model, device}, expiring after `heartbeat_ttl_s`, so a killed worker
disappears by itself. The `live_recent_*` pair covers the last RECENT_S seconds only: the fresh
signal a replay's guard steers by. `busy_ms` is how long the batch in hand has taken so far (0 between
batches): a worker slowed down or stuck says so before its first late answer comes out.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from pipeline import metrics
from pipeline.adapters.periodic import Periodic
from pipeline.contracts.keys import Keys
from pipeline.contracts.records import Heartbeat as HeartbeatDoc
from pipeline.contracts.records import dump_heartbeat, heartbeat, heartbeat_of
from pipeline.core.health import Observation

RECENT_S = 2.0  # seconds behind `live_recent_p95_ms`: fresh enough to steer by, enough answers for a p95


def hb_key(prefix: str, tier: str, worker_id: str) -> str:
    return Keys(prefix).heartbeat(tier, worker_id)


def fault_key(prefix: str, tier: str) -> str:
    """Injected latency for a tier (chaos testing: `tierflow fault latency`)."""
    return Keys(prefix).fault_latency(tier)


AGENT = "agent"  # the heartbeat "tier" of the agents that are not workers (ingest, feedback): readiness only


def ready_agents(r: redis.Redis, prefix: str) -> set[str]:
    """The agents (`ingest`, `feedback`) with a live heartbeat that says ready."""
    return {b["agent"] for b in read_heartbeats(r, prefix, AGENT) if b["ready"]}


def read_heartbeats(r: redis.Redis, prefix: str, tier: str) -> list[HeartbeatDoc]:
    """The live heartbeats of one tier (or of the agents: `AGENT`), every field present."""
    keys = list(r.scan_iter(match=Keys(prefix).heartbeats(tier), count=100))
    if not keys:
        return []
    return [hb for v in r.mget(keys) if v is not None and (hb := heartbeat_of(v)) is not None]


def ready_tiers(r: redis.Redis, prefix: str, tiers: list[str]) -> list[str]:
    """The tiers with at least one worker that has its models loaded and partitions assigned."""
    return [t for t in tiers if any(b["ready"] for b in read_heartbeats(r, prefix, t))]


def observe(r: redis.Redis, prefix: str, tier: str) -> Observation:
    """One tier's health now, from its live workers' heartbeats."""
    return observation(read_heartbeats(r, prefix, tier))


def observation(beats: list[HeartbeatDoc]) -> Observation:
    """A tier's workers now: how many are ready (and how long the youngest of the others has been starting), their
    lag, and the worst of their live answers' p95 and batches in hand (every record of a batch that has taken
    longer than the SLO so far is answered later than the SLO). Live only: see
    `pipeline.contracts.records.Heartbeat` for why ingest and the controller read the same signal."""
    ready = [b for b in beats if b["ready"]]
    return Observation(
        workers=len(ready),
        lag=sum(b["lag"] for b in ready),
        p95_ms=max((max(b["live_p95_ms"], b["busy_ms"]) for b in ready), default=0.0),
        starting_s=min((b["up_s"] for b in beats if not b["ready"]), default=None),
    )


class LatencyWindow:
    """The last `size` latencies (ms) seen by this worker, for its heartbeat's p95."""

    def __init__(self, size: int = 512, horizon_s: float = 5.0) -> None:
        self._items: deque[tuple[float, float]] = deque(maxlen=size)
        self.horizon_s = horizon_s

    def add(self, ms: float) -> None:
        self._items.append((time.monotonic(), ms))

    def extend(self, ms: list[float]) -> None:
        """A batch's latencies, one clock read for all."""
        now = time.monotonic()
        self._items.extend((now, x) for x in ms)

    def p95(self, horizon_s: float | None = None) -> float:
        return self.recent_p95(horizon_s)[0]

    def recent_p95(self, horizon_s: float | None = None) -> tuple[float, int]:
        """(p95 in ms, how many latencies it is of) over the last `horizon_s` (default: the window's horizon)."""
        cutoff = time.monotonic() - (self.horizon_s if horizon_s is None else horizon_s)
        recent = sorted(ms for t, ms in list(self._items) if t >= cutoff)
        if not recent:
            return 0.0, 0
        return recent[min(len(recent) - 1, int(0.95 * len(recent)))], len(recent)


class Heartbeat:
    """A thread that writes this worker's heartbeat every `interval_s` (Redis errors are survived)."""

    def __init__(self, r: redis.Redis, prefix: str, tier: str, worker_id: str, interval_s: float,
                 ttl_s: float, status: Callable[[], dict[str, Any]]) -> None:
        self.r, self.key, self.tier, self.worker_id = r, hb_key(prefix, tier, worker_id), tier, worker_id
        self.fault_key = fault_key(prefix, tier)
        self.interval_s, self.ttl_ms, self.status = interval_s, int(ttl_s * 1000), status
        self.injected_latency_ms = 0.0
        self._t0 = time.monotonic()
        self._thread = Periodic("heartbeat", interval_s, self.beat)

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def follow(self, status: Callable[[], dict[str, Any]]) -> Heartbeat:
        """Beat from now on with `status` (a worker takes over the heartbeat that announced its start)."""
        self.status = status
        self.beat()
        return self

    def beat(self) -> None:
        body = heartbeat(**{"tier": self.tier, "up_s": round(time.monotonic() - self._t0, 2), **self.status(),
                            "ts": time.time(), "worker": self.worker_id})
        try:
            pipe = self.r.pipeline(transaction=False)
            pipe.set(self.key, dump_heartbeat(body), px=self.ttl_ms)
            pipe.get(self.fault_key)
            _, fault = pipe.execute()
            self.injected_latency_ms = float(fault) if fault else 0.0
            if self.tier != AGENT:
                metrics.WORKER_UP.labels(self.tier, self.worker_id).set(body["ts"])
        except (redis.RedisError, OSError):
            metrics.REDIS_ERRORS.labels("heartbeat").inc()

    def stop(self) -> None:
        self._thread.close()  # first: a beat in progress would write the key back after the delete
        with contextlib.suppress(redis.RedisError, OSError):
            self.r.delete(self.key)  # leave at once rather than after the TTL

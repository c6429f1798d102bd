"""Overload: heavy-bound input at 3x the heavy tier's capacity. Lag grows, memory stays bounded, degradation
engages once heavy lag passes `degrade_lag` (heavy-bound traffic answered by light, marked degraded),
and the backlog drains afterwards with nothing lost.

The heavy tier's capacity is made known with `tierflow fault latency`: every heavy batch (at most
`heavy_max_batch` = 32) takes an extra second, so heavy answers at most 32 requests/s.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import pytest
import redis

from pipeline.adapters.heartbeats import observe
from pipeline.settings import Settings
from tests.faults.conftest import Reliability
from tests.faults.harness import Agents, Observer, RssSampler, Traffic, cli, trace, verify
from tests.integration.helpers import wait_ready

DEGRADE_LAG = 200
LATENCY_MS = 1000
RSS_LIMIT_MIB = 400  # per agent; echo agents idle at ~70 MiB


class LagProbe:
    """Heavy lag as ingest sees it (the heavy workers' heartbeats), every 0.25 s: (monotonic, epoch ms, lag)."""

    def __init__(self, s: Settings) -> None:
        self.r = redis.Redis.from_url(s.redis.address)
        self.prefix = s.redis.prefix
        self.points: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="lag")

    def __enter__(self) -> LagProbe:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            obs = observe(self.r, self.prefix, "heavy")
            self.points.append((time.monotonic(), int(time.time() * 1000), obs.lag))

    def first_over(self, limit: int) -> int | None:
        return next((ms for _, ms, lag in self.points if lag > limit), None)


@pytest.mark.parametrize(("variant", "seconds"), [
    pytest.param("short", 15.0, marks=pytest.mark.integration),
    pytest.param("slow", 60.0, marks=[pytest.mark.integration, pytest.mark.slow]),
])
def test_overload_degrades_and_drains(settings_factory: Callable[..., Settings], reliability: Reliability,
                                      variant: str, seconds: float) -> None:
    s = settings_factory()
    capacity = s.heavy.max_batch / (LATENCY_MS / 1000.0)  # an upper bound: the batch also takes its own time
    heavy_rate, light_rate = 3 * capacity, 20.0
    rate = heavy_rate + light_rate
    total = int(rate * seconds)
    cli(s, "thresholds", "set", "degrade_lag", str(DEGRADE_LAG))
    cli(s, "thresholds", "set", "heavy_slo_p95_ms", "600000")  # lag alone decides here, not the latency SLO
    agents = Agents(s).start("ingest", "worker-light", "worker-heavy")
    try:
        wait_ready(s, ["light", "heavy"])
        cli(s, "fault", "latency", "--tier", "heavy", "--ms", str(LATENCY_MS))
        time.sleep(1.5)  # every heavy worker has read the fault with its heartbeat
        with Observer(s) as obs, LagProbe(s) as lag, RssSampler(agents.pids) as rss:
            traffic = Traffic(s, "load", total, rate, mix=(("heavy", heavy_rate), ("light", light_rate)))
            with traffic:
                traffic.wait(seconds + 60)
            ended = time.monotonic()
            waited = obs.wait_for(traffic.sent, timeout=120 + seconds, settle_s=1.0)
            drained_s = time.monotonic() - ended
            # The lag is the workers' heartbeat: the last one may predate the last batch (on a loaded box a CI run
            # ended with every answer out and a heartbeat still saying 2), so wait for the next ones.
            settle = time.monotonic() + 15
            while (not lag.points or lag.points[-1][2] != 0) and time.monotonic() < settle:
                time.sleep(0.25)
            final_lag = lag.points[-1][2] if lag.points else -1
        cli(s, "fault", "latency", "--tier", "heavy", "--ms", "0")
        verdict = verify(traffic.sent, obs, duplicate_bound=0)
        answers = sorted(obs.answers, key=lambda a: a.answered_at - a.total_ms)
        heavy_bound = {i for i, k in traffic.sent.valid.items() if k == "heavy"}
        degraded = [a for a in answers if a.degraded]
        reasons = sorted({a.route_reason for a in degraded})
        over_at = lag.first_over(DEGRADE_LAG)
        first_degraded = (degraded[0].answered_at - degraded[0].total_ms) if degraded else None
        # Degradation must follow the lag: nothing degraded before heavy lag passed the threshold (the probe
        # reads the same heartbeats as ingest, up to one heartbeat + one health poll later).
        in_order = over_at is not None and first_degraded is not None and first_degraded >= over_at - 1500
        switches = sum(1 for a, b in itertools.pairwise(answers)
                       if a.request_id in heavy_bound and b.request_id in heavy_bound and a.degraded != b.degraded)
        heavy_answers = [a.answered_at for a in answers if a.tier == "heavy"]
        busy_s = (max(heavy_answers) - min(heavy_answers)) / 1000 if len(heavy_answers) > 1 else 0.0
        measured = len(heavy_answers) / busy_s if busy_s else 0.0
        peaks = rss.peak_mib()
        dead = agents.dead()
        reliability.record(
            fault=f"overload: heavy-bound input at 3x heavy capacity (fault latency +{LATENCY_MS} ms per heavy "
                  f"batch of <= {s.heavy.max_batch}: <= {capacity:.0f}/s), degrade_lag {DEGRADE_LAG}",
            variant=variant, load=f"{seconds:.0f} s at {heavy_rate:.0f}/s heavy-bound + {light_rate:.0f}/s light "
                                  f"({total:,} requests)",
            invariants={f"heavy lag grew past degrade_lag ({DEGRADE_LAG})": over_at is not None,
                        "degraded to light only after lag passed it": in_order,
                        "degraded answers are light, reason lag": bool(degraded) and all(
                            a.tier == "light" and "degraded_lag" in a.route_reason for a in degraded),
                        "0 lost, one answer per id": not verdict.lost and not verdict.unexpected
                        and verdict.duplicates == 0,
                        "backlog drained (lag 0)": final_lag == 0,
                        f"peak RSS <= {RSS_LIMIT_MIB} MiB per agent": all(v <= RSS_LIMIT_MIB for v in peaks.values()),
                        "no agent died": not dead},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered, "lost": len(verdict.lost),
                    "max heavy lag": max((p[2] for p in lag.points), default=0),
                    "degraded answers": len(degraded), "heavy answers": len(heavy_answers),
                    "measured heavy rate /s": round(measured, 1), "degraded<->heavy switches": switches,
                    "s from lag>limit to first degraded": round((first_degraded - over_at) / 1000, 1)
                    if in_order and first_degraded is not None and over_at is not None else None,
                    "drain s after input stopped": round(drained_s, 1), "reasons": reasons},
            peak_rss_mib=peaks,
            notes="Hysteresis: heavy returns only after lag stays under degrade_lag x recover_ratio for "
                  "recover_after_s, so heavy-bound traffic alternates between heavy and degraded light in "
                  "long runs instead of flapping per message; heavy's backlog stays near degrade_lag.",
        )
        assert not dead, [agents.log(n)[-1500:] for n in ("ingest", "worker-heavy")]
        assert verdict.held and not verdict.lost, (verdict.violations, trace(s, verdict.lost[:3]))
        assert over_at is not None and degraded, (reasons, lag.points[-20:])
        assert in_order, (over_at, first_degraded)
        assert all(a.tier == "light" and "degraded_lag" in a.route_reason for a in degraded), reasons
        assert final_lag == 0, lag.points[-10:]
        assert all(v <= RSS_LIMIT_MIB for v in peaks.values()), peaks
        assert waited < 120 + seconds
    finally:
        agents.stop()

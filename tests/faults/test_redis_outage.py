"""Redis goes away under real agent processes: routing goes on with the last-known thresholds, workers keep
answering (their heartbeats fail quietly), and everything recovers when Redis is back (empty: no
persistence, as the embedded Valkey runs without --data; refilled from the control topic).
tests/integration/test_routing_live.py covers the same with agents in threads; this one kills a real server under
real processes and counts every request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from pipeline.adapters.heartbeats import ready_tiers
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings
from tests.faults.conftest import Reliability
from tests.faults.harness import Agents, Observer, RssSampler, Traffic, trace, verify
from tests.integration.helpers import wait_ready

TIERS = ["light", "heavy", "multimodal"]
MIX = (("light", 0.4), ("medium", 0.3), ("heavy", 0.25), ("image", 0.05))


@pytest.fixture
def own_redis(services: Settings, tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    """A Redis of this test's own, so it can be killed and started again on the same port."""
    s = services.updated(redis_url=None, redis_port=free_port(), data_dir=tmp_path)
    stack = Stack(s)
    stack.start_redis()
    yield stack, s.redis.address
    stack.stop()


@pytest.mark.parametrize(("variant", "outage_s"), [
    pytest.param("short", 5.0, marks=pytest.mark.integration),
    pytest.param("slow", 30.0, marks=[pytest.mark.integration, pytest.mark.slow]),
])
def test_redis_outage_under_load(settings_factory: Callable[..., Settings], own_redis: tuple[Stack, str],
                                 reliability: Reliability, variant: str, outage_s: float) -> None:
    server, url = own_redis
    s = settings_factory(redis_url=url)
    # Non-default thresholds, so answers show which document routed them: 52-character texts go light
    # under v2 (length_threshold 60) and would go heavy under the defaults (50).
    ThresholdStore(redis.Redis.from_url(url), s.redis.prefix).update("test", "outage test", length_threshold=60)
    agents = Agents(s).start("ingest", "worker-light", "worker-heavy", "worker-multimodal")
    rate = 200.0
    total = int(rate * (outage_s + 10.0))
    try:
        wait_ready(s, TIERS)
        with Observer(s) as obs:
            traffic = Traffic(s, "rds", total, rate, mix=MIX)
            with RssSampler(agents.pids) as rss, traffic:
                time.sleep(3.0)
                server.kill("redis")
                down_ms = int(time.time() * 1000)
                time.sleep(outage_s)
                up_ms = int(time.time() * 1000)
                server.start_redis()  # back empty: ingest writes its last-known thresholds back
                traffic.wait(traffic.duration_s + 60)
                waited = obs.wait_for(traffic.sent, timeout=90, settle_s=2.0)
        r = redis.Redis.from_url(url)
        restored = ThresholdStore(r, s.redis.prefix).get_or_none()
        beating = ready_tiers(r, s.redis.prefix, TIERS)
        verdict = verify(traffic.sent, obs, duplicate_bound=0)
        during = [a for a in obs.answers if down_ms + 500 <= a.answered_at <= up_ms]
        tiers_during = sorted({a.tier for a in during})
        medium = {i for i, k in traffic.sent.valid.items() if k == "medium"}
        medium_during = [a for a in during if a.request_id in medium]
        last_known = bool(medium_during) and all(a.tier == "light" and a.threshold_version == 2
                                                 for a in medium_during)
        degraded = sum(1 for a in obs.answers if a.degraded)
        dead = agents.dead()
        reliability.record(
            fault=f"Redis killed for {outage_s:.0f} s, back empty", variant=variant,
            load=f"{total:,} requests at {rate:.0f}/s across all tiers",
            invariants={"0 lost": not verdict.lost, "no duplicates": verdict.duplicates == 0,
                        "every tier answered during the outage": tiers_during == sorted(TIERS),
                        "routing on last-known thresholds (v2)": last_known,
                        "no agent died": not dead,
                        "thresholds and heartbeats back after": restored is not None and restored.version >= 2
                        and sorted(beating) == sorted(TIERS)},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered, "lost": len(verdict.lost),
                    "answered during outage": len(during), "degraded answers": degraded,
                    "thresholds version after": restored.version if restored else None,
                    "drain s": round(waited, 1)},
            peak_rss_mib=rss.peak_mib(),
            notes="Redis is off the hot path: ingest routes from its cached thresholds, health keeps its last "
                  "verdict, workers' heartbeats fail and are retried each second. Back empty, the ingest cache "
                  "restores it from the control topic (every threshold version, the VIPs); heavy may read as "
                  "'no_workers' for the second before the first heartbeat (counted in degraded answers).",
        )
        assert not dead, [agents.log(n)[-1500:] for n in ("ingest", "worker-light")]
        assert verdict.held, (verdict.violations, trace(s, verdict.lost[:3]))
        assert tiers_during == sorted(TIERS), tiers_during
        assert last_known, medium_during[:5]
        assert restored is not None and restored.version >= 2 and restored.length_threshold == 60
        assert sorted(beating) == sorted(TIERS)
    finally:
        agents.stop()

"""kill -9 of agents at random points of a run under `tierflow up`: nothing lost, one answer per id after
dedupe, at most one batch of duplicates per crash.

`tierflow up` runs against the test's broker and Redis and restarts whatever dies, as in production;
the test kills the light worker, the heavy worker, the ingest agent and the feedback agent (its group
leaves by session timeout, not by a clean leave) while traffic flows, then checks from the outside.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.settings import Settings
from tests.faults.conftest import Reliability
from tests.faults.harness import Observer, RssSampler, Traffic, Up, trace, verify
from tests.integration.helpers import wait_ready

VICTIMS = ("worker-light", "worker-heavy", "ingest", "feedback")


def crash_bound(s: Settings, victim: str) -> int:
    """Answers a crash of `victim` may repeat: the one batch it had consumed but not committed."""
    return {"worker-light": s.light.max_batch, "worker-heavy": s.heavy.max_batch,
            "worker-multimodal": s.multimodal.max_batch, "ingest": s.ingest.batch}.get(victim, 0)


@pytest.mark.parametrize(("variant", "total", "rate", "rounds"), [
    pytest.param("short", 3000, 250.0, 1, marks=pytest.mark.integration),
    pytest.param("slow", 20_000, 400.0, 3, marks=[pytest.mark.integration, pytest.mark.slow]),
])
def test_kill_agents_during_a_run(settings_factory: Callable[..., Settings], tmp_path: Path,
                                  reliability: Reliability, variant: str, total: int, rate: float,
                                  rounds: int) -> None:
    s = settings_factory(data_dir=tmp_path)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    up = Up(s)
    try:
        deadline = time.monotonic() + 120
        while set(up.agents()) != {"ingest", "worker-light", "worker-heavy", "worker-multimodal", "feedback"}:
            assert up.alive() and time.monotonic() < deadline, up.output()
            time.sleep(0.2)
        wait_ready(s, ["light", "heavy", "multimodal"])
        up.wait_up()
        with Observer(s) as obs:
            warm = Traffic(s, "warm", 30, 100.0)
            with warm:
                warm.wait(30)
            obs.wait_for(warm.sent, timeout=60, settle_s=0)
            traffic = Traffic(s, "run", total, rate, seed=seed, sent=warm.sent)
            # Random points in the middle 80% of the run; each round kills every victim once, in random order.
            span = traffic.duration_s / rounds
            schedule = sorted((r * span + rng.uniform(0.1, 0.9) * span, v)
                              for r in range(rounds) for v in rng.sample(VICTIMS, len(VICTIMS)))
            crashes: list[tuple[str, float]] = []
            with RssSampler(up.agents) as rss, traffic:
                for at, victim in schedule:
                    time.sleep(max(0.0, at - (time.monotonic() - traffic.started)))
                    crashes.append((victim, up.kill(victim)))
                traffic.wait(traffic.duration_s + 120)
                waited = obs.wait_for(traffic.sent, timeout=180, settle_s=3.0)
        bound = sum(crash_bound(s, v) for v, _ in crashes)
        verdict = verify(traffic.sent, obs, duplicate_bound=bound)
        alive = set(up.agents()) == {"ingest", "worker-light", "worker-heavy", "worker-multimodal", "feedback"}
        restart_s = max(t for _, t in crashes)
        reliability.record(
            fault=f"kill -9 of {', '.join(VICTIMS)} at random points, restarted by `tierflow up`",
            variant=variant, load=f"{total:,} requests at {rate:.0f}/s (60% light, 35% heavy, 5% image), "
                                  f"{len(crashes)} crashes, seed {seed}",
            invariants={"0 lost": not verdict.lost, "one answer per id after dedupe": not verdict.unexpected,
                        f"duplicates <= one batch per crash ({bound})": verdict.duplicates <= bound,
                        "nothing dead-lettered": not verdict.valid_dead,
                        "every agent running again": alive and up.alive()},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered, "lost": len(verdict.lost),
                    "raw answers": verdict.raw_answers, "duplicates": verdict.duplicates, "crashes": len(crashes),
                    "slowest restart s": round(restart_s, 1), "drain after last send s": round(waited, 1)},
            peak_rss_mib=rss.peak_mib(),
        )
        assert verdict.held, (verdict.violations, trace(s, verdict.lost[:3]))
        assert alive and up.alive(), up.output()
    finally:
        up.stop()

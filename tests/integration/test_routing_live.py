"""Routing under live traffic: threshold changes without restart, Redis outages, heavy-tier degradation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis

from pipeline.adapters.kafka import topics_of
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.agents.ingest import Ingest
from pipeline.contracts.topics import Tier
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings
from tests.conftest import Running, free_port
from tests.integration.helpers import Live, drain, reader, values, wait_ready
from workers.models.echo import EchoModel
from workers.runner import Worker

pytestmark = pytest.mark.integration


def cli(settings: Settings, *args: str) -> str:
    env = {**os.environ, **settings.with_env()}
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout


def echo_pipeline(s: Settings, running: Running, tiers: tuple[Tier, ...] = tuple(Tier),
                  r: redis.Redis | None = None) -> dict[Tier, Worker]:
    running.start(Ingest(s, r=r))
    workers = {t: running.start(Worker(s, t, EchoModel(), r=r)) for t in tiers}
    wait_ready(s, [t.value for t in tiers])
    time.sleep(1.0)  # ingest joins its group meanwhile; its first fetch is the slowest
    return workers


def test_threshold_change_applies_within_a_second(settings_factory: Callable[..., Settings],
                                                  running: Running) -> None:
    s = settings_factory()
    answers = reader(s, topics_of(s).answers)
    echo_pipeline(s, running)
    text = "x" * 70  # heavy under the default 50, light under 100
    with Live(s, "live", 100, texts=[text]) as traffic:
        time.sleep(3.0)
        out = cli(s, "thresholds", "set", "length_threshold", "100", "--reason", "test")
        assert "length_threshold = 100" in out
        # When the new version was written, not when the command started (its interpreter takes seconds to start
        # on a busy box): the second it has to apply counts from there.
        changed_at = int(ThresholdStore(redis.Redis.from_url(s.redis.address), s.redis.prefix).get().updated_at * 1000)
        time.sleep(3.0)
    got = values(drain(answers, lambda ms: len(ms) >= len(traffic.sent), timeout=60))
    answers.close()
    assert len({a["request_id"] for a in got}) == len(traffic.sent)
    before = [a for a in got if a["timings_ms"]["total"] >= 0 and _ingested(a) < changed_at]
    after = [a for a in got if _ingested(a) > changed_at + 1000]
    assert before and after
    assert all(a["tier"] == "heavy" and a["route_reason"] == "length" for a in before)
    assert all(a["tier"] == "light" and a["threshold_version"] == 2 for a in after)
    first_new = min(_ingested(a) for a in got if a["threshold_version"] == 2)
    assert first_new - changed_at <= 1000, f"took {first_new - changed_at} ms"


def _ingested(a: dict[str, Any]) -> int:
    return int(a["answered_at"]) - int(a["timings_ms"]["total"]) + int(a["timings_ms"]["ingest"])


@pytest.fixture
def own_redis(services: Settings, tmp_path: Any) -> Iterator[tuple[Stack, Settings]]:
    """A Redis of this test's own, so it can be stopped and restarted."""
    s = services.updated(redis_url=None, redis_port=free_port(), data_dir=tmp_path)
    stack = Stack(s)
    stack.start_redis()
    yield stack, s.updated(redis_url=s.redis.address)
    stack.stop()


def test_redis_outage_keeps_routing_with_last_thresholds(settings_factory: Callable[..., Settings],
                                                         running: Running,
                                                         own_redis: tuple[Stack, Settings]) -> None:
    stack, rs = own_redis
    s = settings_factory(redis_url=rs.redis.address)
    r = redis.Redis.from_url(s.redis.address, socket_timeout=1, socket_connect_timeout=1)
    store = ThresholdStore(r, s.redis.prefix)
    store.update("test", "route everything light", length_threshold=500)
    answers = reader(s, topics_of(s).answers)
    ingest = running.start(Ingest(s, r=r, health_checks=False))
    for t in Tier:
        running.start(Worker(s, t, EchoModel(), r=r))
    wait_ready(s, [t.value for t in Tier])
    with Live(s, "live", 100, texts=["y" * 80]) as traffic:
        time.sleep(2.0)
        stack.stop()  # Redis gone mid-stream
        time.sleep(3.0)
        assert ingest.cache.stale
        stack.start_redis()  # back, empty: ingest restores its last-known document (v2)
        fresh = ThresholdStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
        deadline = time.monotonic() + 10
        while fresh.get_or_none() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        restored = fresh.get_or_none()
        assert restored is not None and (restored.version, restored.length_threshold) == (2, 500)
        fresh.update("test", "operator change after the outage", length_threshold=10)
        deadline = time.monotonic() + 10
        while ingest.cache.current.length_threshold != 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not ingest.cache.stale and ingest.cache.current.length_threshold == 10
        time.sleep(1.0)
    got = values(drain(answers, lambda ms: len({orjson.loads(m.value() or b"{}").get("request_id") for m in ms})
                       >= len(traffic.sent), timeout=60))
    answers.close()
    assert {a["request_id"] for a in got} == set(traffic.sent)
    outage = [a for a in got if a["threshold_version"] == 2]
    assert outage and all(a["tier"] == "light" for a in outage)  # last-known length_threshold=500 held
    assert any(a["tier"] == "heavy" for a in got)  # the restored threshold applied


def test_heavy_outage_degrades_to_light_and_recovers(settings_factory: Callable[..., Settings],
                                                     running: Running) -> None:
    s = settings_factory(heartbeat_announce_s=0.0)  # no heavy worker at all from the start: an outage
    store = ThresholdStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
    store.update("test", "fast recovery for the test", recover_after_s=1.0)
    answers = reader(s, topics_of(s).answers)
    workers = echo_pipeline(s, running, tiers=(Tier.LIGHT,))
    assert workers
    with Live(s, "live", 100, texts=["z" * 80]):
        time.sleep(3.0)  # no heavy worker: heavy-bound traffic degrades
        heavy = running.start(Worker(s, Tier.HEAVY, EchoModel()))
        time.sleep(6.0)
        heavy.stop()
        time.sleep(4.0)
    # In the order the requests were sent (ids `live-N`): routing is what may not flap. By answer time, two tiers'
    # answers interleave at each switch (a degraded answer from light's queue after heavy's first; seen on a loaded
    # machine) without any request having been routed back and forth.
    got = sorted(values(drain(answers, lambda ms: False, timeout=15)),
                 key=lambda a: int(a["request_id"].rsplit("-", 1)[1]))
    answers.close()
    phases = [("degraded" if a["degraded"] else a["tier"]) for a in got]
    assert phases[0] == "degraded"
    assert "heavy" in phases
    degraded = [a for a in got if a["degraded"]]
    assert all(a["tier"] == "light" and "degraded_no_workers" in a["route_reason"] for a in degraded)
    assert phases[-1] == "degraded"  # heavy stopped again -> degraded again
    # no flapping: degraded -> heavy -> degraded, nothing in between
    runs = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    assert runs == ["degraded", "heavy", "degraded"], runs


def under_fault(s: Settings, running: Running, rate: float, ms: int, seconds: int, after_s: float,
                tag: str) -> tuple[float, list[dict[str, Any]]]:
    """An echo pipeline under a 300 ms heavy SLO, heavy-bound live traffic at `rate`, and `ms` of injected
    latency per heavy batch for `seconds` from 2 s in: (when the fault was set, the answers in answer order)."""
    store = ThresholdStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
    store.update("test", "tight SLO", heavy_slo_p95_ms=300, recover_after_s=1.0)
    answers = reader(s, topics_of(s).answers)
    echo_pipeline(s, running)
    with Live(s, tag, rate, texts=["w" * 80]):
        time.sleep(2.0)
        at = time.time()
        cli(s, "fault", "latency", "--tier", "heavy", "--ms", str(ms), "--seconds", str(seconds))
        time.sleep(after_s)
    got = sorted(values(drain(answers, lambda ms: False, timeout=10)), key=lambda a: a["answered_at"])
    answers.close()
    return at, got


def test_injected_latency_degrades_heavy_traffic(settings_factory: Callable[..., Settings],
                                                 running: Running) -> None:
    # 4 s of fault, then the 5 s latency window drains and the 1 s dwell passes
    at, got = under_fault(settings_factory(), running, 50, 400, 4, 14.0, "live")
    slow = [a for a in got if a["degraded"]]
    assert slow and all("degraded_slow" in a["route_reason"] for a in slow)
    # Recovered after the fault expired. Not "the last answer is heavy": a loaded 2-core box can push the echo
    # heavy tier's p95 over this test's 300 ms SLO again (a CI run: 306 ms, degraded and back a second time).
    assert any(a["tier"] == "heavy" and _ingested(a) / 1000 > at + 4 + 1 for a in got), "heavy never came back"


def test_a_heavy_batch_stuck_past_the_slo_degrades_before_its_answers_come_out(
        settings_factory: Callable[..., Settings], running: Running) -> None:
    # Low traffic: the stuck worker's lag stays far under degrade_lag, and no late answer comes out to raise its
    # p95 until the batch ends. Its heartbeat's `busy_ms` is the only news, and ingest must act on it.
    stuck_at, got = under_fault(settings_factory(), running, 5, 8000, 4, 14.0, "stuck")

    def ingested(a: dict[str, Any]) -> float:
        return _ingested(a) / 1000

    late = [a for a in got if a["tier"] == "heavy" and a["timings_ms"]["total"] > 5000]
    degraded = [a for a in got if a["degraded"] and ingested(a) >= stuck_at]
    assert late, "no heavy batch was held up by the fault"
    assert degraded and all("degraded_slow" in a["route_reason"] for a in degraded)
    first_late_out = min(a["answered_at"] for a in late) / 1000
    # the stuck batch started at most a second before the first degraded request (the batch age passes the SLO,
    # the next heartbeat says so, ingest reads it every 0.25 s); its late answers came out 8 s after it started
    assert min(ingested(a) for a in degraded) < first_late_out - 3.0, "degraded only once the late answers came out"


class SlowStart(EchoModel):
    """An echo model that takes a heavy model's time to load."""

    def setup(self, device: str) -> None:
        time.sleep(4.0)


def test_heavy_bound_traffic_waits_for_a_heavy_worker_that_is_starting(settings_factory: Callable[..., Settings],
                                                                      running: Running) -> None:
    """A stack starting together (issue 18: 12.9% of the first traffic went to light while heavy loaded): ingest
    holds heavy-bound requests in the heavy topic while heavy workers announce they are starting."""
    s = settings_factory()
    answers = reader(s, topics_of(s).answers)
    running.start(Ingest(s))
    running.start(Worker(s, Tier.LIGHT, EchoModel()))
    wait_ready(s, ["light"])
    with Live(s, "live", 50, texts=["z" * 80]) as traffic:  # heavy-bound (length over 50)
        time.sleep(2.0)  # no heavy heartbeat yet: ingest started seconds ago, so its workers may be announcing
        heavy = Worker(s, Tier.HEAVY, SlowStart())
        running.start(heavy)  # announces at once; ready once loaded (4 s) and in its group (tansu: seconds more)
        deadline = time.monotonic() + 60
        while not heavy.ready and time.monotonic() < deadline:
            time.sleep(0.2)
        assert heavy.ready
        time.sleep(2.0)  # and traffic while it answers
    got = values(drain(answers, lambda ms: len(ms) >= len(traffic.sent), timeout=60))
    answers.close()
    assert {a["request_id"] for a in got} == set(traffic.sent)
    assert not [a for a in got if a["degraded"]]
    assert {a["tier"] for a in got} == {"heavy"}

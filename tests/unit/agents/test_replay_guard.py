"""Replay logic without a broker: the loops' backfill gate, the replay's live-latency guard and pacing, time seeks."""

from __future__ import annotations

import pytest

from pipeline.adapters.heartbeats import LatencyWindow
from pipeline.agents.replay import first_offset_at
from pipeline.core.backfill import BackfillGate
from pipeline.core.pacing import LiveGuard, Pacer, RateControl, TierLatency


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_backfill_waits_for_an_idle_loop_and_keeps_to_its_duty_cycle() -> None:
    clock = Clock()
    gate = BackfillGate(duty=0.25, gap_s=0.0, starve_s=1.0, clock=clock)
    assert gate.due(live_waiting=False)
    assert not gate.due(live_waiting=True)  # a live record waits: live goes first
    started = clock()
    clock.t += 0.010  # a backfill batch of 10 ms ...
    gate.done(started, records=200)
    assert not gate.due(live_waiting=False)
    clock.t += 0.029
    assert not gate.due(live_waiting=False)
    clock.t += 0.002  # ... rests 30 ms: backfill holds at most a quarter of the loop
    assert gate.due(live_waiting=False)


def test_backfill_batches_are_spaced_by_the_gap_and_the_idle_wait_ends_at_the_next_turn() -> None:
    clock = Clock()
    gate = BackfillGate(duty=1.0, gap_s=0.1, clock=clock)
    gate.done(clock(), records=50)
    assert gate.active and not gate.due(live_waiting=False)
    assert gate.idle_wait_s(0.1) == pytest.approx(0.1)
    clock.t += 0.06
    assert gate.idle_wait_s(0.1) == pytest.approx(0.04)  # wait for live no longer than the next backfill turn
    clock.t += 0.041
    assert gate.due(live_waiting=False)
    gate.done(clock(), records=0)  # nothing queued: wait for live as usual
    assert not gate.active and gate.idle_wait_s(0.1) == 0.1


def test_backfill_is_not_starved_by_live_traffic_that_never_pauses() -> None:
    clock = Clock()
    gate = BackfillGate(duty=0.25, gap_s=0.1, starve_s=1.0, clock=clock)
    gate.done(clock(), records=10)
    clock.t += 0.5
    assert not gate.due(live_waiting=True)
    clock.t += 0.5
    assert gate.due(live_waiting=True)


def test_rate_grows_by_half_halves_on_congestion_and_stays_within_bounds() -> None:
    c = RateControl(rate=200.0, floor=50.0, ceiling=1200.0)
    assert [c.update(congested=False) for _ in range(3)] == [300.0, 450.0, 675.0]
    assert c.update(congested=True) == pytest.approx(337.5)
    for _ in range(10):
        c.update(congested=True)
    assert c.rate == 50.0  # slows down, never stops
    for _ in range(50):
        c.update(congested=False)
    assert c.rate == 1200.0  # never above the operator's rate


class Beats:
    """Heartbeats as the guard reads them: each read() is a new beat unless `fresh` is False."""

    def __init__(self, latency: TierLatency) -> None:
        self.latency, self.ts, self.fresh = latency, 1.0, True

    def __call__(self) -> tuple[TierLatency, float]:
        if self.fresh:
            self.ts += 1.0
        return dict(self.latency), self.ts


def make_guard(beats: Beats, clock: Clock, settle_s: float = 3.0) -> LiveGuard:
    return LiveGuard(beats, 1.15, 2500.0, start_rate=200.0, min_rate=50.0, interval_s=0.5, horizon_s=2.0,
                     settle_s=settle_s, clock=clock, sleep=clock.sleep)


def test_guard_changes_the_rate_once_per_signal_horizon_and_cuts_at_once_after_a_rise() -> None:
    clock = Clock()
    beats = Beats({"light": (40.0, 500), "heavy": (50.0, 100)})
    guard = make_guard(beats, clock)
    assert guard.baseline == {"light": 40.0, "heavy": 50.0}
    clock.t += 0.5
    assert guard.rate() == 200.0  # live as fast as before, but the start rate has not been seen for a horizon
    clock.t += 1.5
    assert guard.rate() == 300.0  # a horizon at 200 msg/s and live held: grow by half
    clock.t += 0.5
    beats.latency["heavy"] = (70.0, 100)  # heavy's recent p95 40% over its baseline
    assert guard.rate() == 150.0  # a cut needs no wait after a rise
    clock.t += 0.5
    assert guard.rate() == 150.0  # still slow, but the signal is older than the cut: hold
    clock.t += 1.6
    assert guard.rate() == 75.0  # a horizon later and still slow: cut again
    beats.latency["heavy"] = (52.0, 100)  # within 15% (and the slack) again
    clock.t += 0.5
    assert guard.rate() == 75.0
    clock.t += 1.5
    assert guard.rate() == pytest.approx(112.5)
    assert guard.cuts == 2


def test_guard_pauses_to_rebaseline_when_live_latency_stays_high_after_cuts() -> None:
    clock = Clock()
    beats = Beats({"light": (40.0, 500)})
    guard = make_guard(beats, clock)
    beats.latency["light"] = (80.0, 500)  # live twice as slow, and it stays so: a drift, or the replay?
    clock.t += 2.0
    assert guard.rate() == 100.0  # cut
    clock.t += 2.0
    assert guard.rate() == 50.0  # a horizon later, no better: cut again
    clock.t += 2.0
    assert guard.rate() == 0.0  # and again no better: pause the replay and look at live latency alone
    clock.t += 1.0
    assert guard.rate() == 0.0
    beats.latency["light"] = (78.0, 500)  # without the replay live is as slow: that is today's baseline
    clock.t += 1.6
    assert guard.rate() == 50.0 and guard.baseline == {"light": 78.0} and guard.probes == 1
    clock.t += 2.0
    assert guard.rate() == 75.0  # within the new baseline's limit: the replay grows again


def test_guard_wait_rate_sleeps_out_a_pause() -> None:
    clock = Clock()
    beats = Beats({"light": (40.0, 500)})
    guard = make_guard(beats, clock)
    guard._probe_until = clock() + 2.5
    assert guard.wait_rate() == 200.0 and clock() >= guard._checked


def test_guard_acts_only_on_new_heartbeats_and_ignores_tiers_without_live_answers() -> None:
    clock = Clock()
    beats = Beats({"light": (40.0, 500), "multimodal": (0.0, 0)})
    guard = make_guard(beats, clock)
    assert set(guard.baseline) == {"light"}
    beats.fresh = False
    clock.t += 2.0
    assert guard.rate() == 200.0  # the same beat again: no news, no change
    beats.fresh = True
    beats.latency["light"] = (42.0, 3)  # too few answers for a p95: no verdict against the replay
    beats.latency["multimodal"] = (900.0, 50)  # no baseline: not judged
    clock.t += 0.5
    assert guard.rate() == 300.0


def test_guard_without_live_traffic_waits_for_it_briefly_then_lets_the_replay_run() -> None:
    clock = Clock()
    beats = Beats({"light": (0.0, 0)})
    t0 = clock()
    guard = make_guard(beats, clock, settle_s=3.0)
    assert guard.baseline == {} and clock() - t0 >= 3.0
    for _ in range(20):
        clock.t += 2.0
        guard.rate()
    assert guard.rate() == 2500.0  # nothing to protect: up to the operator's rate


def test_guard_takes_the_baseline_once_live_answers_show_up() -> None:
    clock = Clock()
    beats = Beats({"light": (0.0, 0)})
    calls = {"n": 0}

    def read() -> tuple[TierLatency, float]:
        calls["n"] += 1
        if calls["n"] == 3:  # live traffic began a moment ago
            beats.latency["light"] = (45.0, 200)
        return beats()

    guard = LiveGuard(read, 1.15, None, clock=clock, sleep=clock.sleep)
    assert guard.baseline == {"light": 45.0}
    assert guard.control.ceiling == 20_000.0  # no --rate: the guard alone paces


def test_latency_window_recent_p95_covers_only_its_horizon() -> None:
    w = LatencyWindow(size=100, horizon_s=5.0)
    w.extend([500.0] * 10)
    assert w.recent_p95(5.0) == (500.0, 10)
    w._items = type(w._items)(((t - 3.0, ms) for t, ms in w._items), maxlen=100)  # those were 3 s ago
    w.extend([10.0] * 40)
    assert w.recent_p95(2.0) == (10.0, 40)
    assert w.p95() == 500.0 and w.recent_p95()[1] == 50


class FakeMessage:
    def __init__(self, ts: int) -> None:
        self.ts = ts

    def timestamp(self) -> tuple[int, int]:
        return 1, self.ts


class FakeReader:
    """A partition's record timestamps, read one by one (and counted)."""

    def __init__(self, ts: list[int]) -> None:
        self.ts, self.reads = ts, 0

    def read(self, partition: int, offset: int) -> FakeMessage | None:
        self.reads += 1
        return FakeMessage(self.ts[offset]) if 0 <= offset < len(self.ts) else None

    def end(self, partition: int) -> int:
        return len(self.ts)


@pytest.mark.parametrize("timestamps", [
    list(range(0, 100_000, 10)),  # even
    [0] * 3000 + list(range(5000, 12_000)) + [20_000] * 500,  # a burst, a steady stream, another burst
    sorted((i * 7919) % 100_003 for i in range(10_000)),  # uneven gaps
])
def test_time_seek_finds_the_first_record_at_or_after_a_time_in_few_reads(timestamps: list[int]) -> None:
    for ts in (-5, 0, 1, 4999, 5000, 7777, 12_000, 19_999, 20_000, 20_001, 99_990, 10**9):
        reader = FakeReader(timestamps)
        want = next((i for i, t in enumerate(timestamps) if t >= ts), len(timestamps))
        assert first_offset_at(reader, 0, ts, None) == want  # type: ignore[arg-type]
        assert reader.reads <= 2 * len(timestamps).bit_length() + 2


def test_time_seek_trusts_a_verified_guess_and_searches_only_within_bounds() -> None:
    reader = FakeReader(list(range(1000)))
    assert first_offset_at(reader, 0, 500, guess=500) == 500  # type: ignore[arg-type]
    assert reader.reads == 2
    assert first_offset_at(reader, 0, 500, guess=0, lo=0, hi=1000) == 500  # type: ignore[arg-type]
    assert first_offset_at(reader, 0, 10, None, lo=600, hi=1000) == 600  # type: ignore[arg-type]


def test_pacer_sends_a_tenth_of_a_second_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("pipeline.agents.replay.time.monotonic", clock)
    monkeypatch.setattr("pipeline.agents.replay.time.sleep", clock.sleep)
    pacer = Pacer(2000.0)
    assert pacer.chunk_size() == 200
    t0 = clock()
    for _ in range(10):
        pacer.wait(pacer.chunk_size())
    assert clock() - t0 == pytest.approx(1.0)  # 2000 records in a second, in ten sleeps
    pacer.rate = 50.0
    assert pacer.chunk_size() == 5
    assert Pacer(None).chunk_size() == 500


def test_live_latency_reads_nothing_while_redis_is_unreachable() -> None:
    """The guard then holds its rate (no heartbeat newer than the last): a Redis outage neither stops a replay
    nor lets it speed up blind."""
    import redis

    from pipeline.agents.replay import read_live_latency
    from pipeline.ops.devstack import free_port

    r = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    assert read_live_latency(r, "tierflow") == ({}, 0.0)

"""Windowed statistics: histograms, windows, label and shadow joins, snapshots."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from pipeline.core.stats import AggConfig, Aggregator, LinearHistogram, LogHistogram

NOW = 1_800_000_000_000


def rec(rid: str, tier: str = "light", *, final: bool = True, conf: float = 0.9, intent: str = "a",
        label: str | None = None, escalated: bool = False, degraded: bool = False, shadow: bool = False,
        total: float = 10.0, chars: int = 30, vip: bool = False, version: int = 1, at: int = NOW,
        model: str | None = None) -> dict[str, Any]:
    return {
        "request_id": rid, "tier": tier, "stage": tier, "model": model or f"{tier}-m", "intent": intent,
        "confidence": conf, "final": final, "shadow": shadow, "escalated": escalated, "degraded": degraded,
        "threshold_version": version, "answered_at": at, "batch_size": 4, "label": label,
        "timings_ms": {"ingest": 1, "queue": 2, "inference": 3, "total": total},
        "features": {"chars": chars, "vip": vip},
    }


# --------------------------------------------------------------------------- histograms
def test_log_histogram_quantiles_within_two_percent() -> None:
    rnd = random.Random(1)
    xs = sorted(rnd.lognormvariate(4, 1) for _ in range(20_000))
    h = LogHistogram()
    for x in xs:
        h.add(x)
    for q in (0.5, 0.95, 0.99):
        exact = xs[int(q * len(xs))]
        assert h.quantile(q) == pytest.approx(exact, rel=0.03)
    assert h.cdf(xs[len(xs) // 4]) == pytest.approx(0.25, abs=0.01)
    assert h.mean() == pytest.approx(sum(xs) / len(xs))


def test_log_histogram_merge_and_json() -> None:
    a, b = LogHistogram(), LogHistogram()
    for v in (0, 1, 5, 50, 500):
        a.add(v)
    for v in (7, 70):
        b.add(v, 2)
    a.merge(b)
    c = LogHistogram.from_json(orjson.loads(orjson.dumps(a.to_json())))
    assert c.count == 9 and c.bins == a.bins and c.total == a.total
    assert c.quantile(0.0) == 0.0
    assert LogHistogram().quantile(0.5) is None and LogHistogram().cdf(3) == 0.0


def test_linear_histogram_cdf_and_quantile_are_inverse() -> None:
    h = LinearHistogram()
    rnd = random.Random(2)
    for _ in range(10_000):
        h.add(rnd.random())
    for q in (0.05, 0.3, 0.7):
        t = h.quantile(q)
        assert t is not None
        assert t == pytest.approx(q, abs=0.02)
        assert h.cdf(t) == pytest.approx(q, abs=1e-9)
    assert h.cdf(0.0) == 0.0 and h.cdf(1.0) == 1.0
    h.add(1.0)  # a confidence of exactly 1
    assert LinearHistogram.from_json(h.to_json()).counts == h.counts


def test_full_confidence_is_below_no_threshold() -> None:
    h = LinearHistogram()
    h.add(1.0, 300)
    h.add(0.5, 100)
    # nothing at 1.0 escalates, however close to 1 escalate_below is (it was spread over the last bin)
    assert h.cdf(0.9961) == pytest.approx(0.25) and h.cdf(1.0) == pytest.approx(0.25)
    assert h.quantile(0.9) == 1.0 and h.quantile(0.2) == pytest.approx(0.5, abs=0.005)
    merged = LinearHistogram.from_json(orjson.loads(orjson.dumps(h.to_json())))
    merged.merge(h)
    assert merged.count == 800 and merged.cdf(0.9999) == pytest.approx(0.25)


# --------------------------------------------------------------------------- windows
def test_the_heavy_slo_sees_the_tier_s_decision_not_the_writer_s_seconds() -> None:
    a = Aggregator(AggConfig(window_ms=10_000, hop_ms=1_000))
    for i in range(20):
        r = rec(f"w{i}", "heavy", total=4_300)
        r["timings_ms"].update(inference=4_100, write=4_000)  # a written reply: 4 s of writing, 300 ms of the rest
        a.add_result(r, NOW)
    heavy = a.window(NOW).tiers["heavy"]
    assert heavy.p95_ms == pytest.approx(300, rel=0.03)


def test_window_counts_per_tier() -> None:
    a = Aggregator(AggConfig(window_ms=10_000, hop_ms=1_000))
    # 6 light answers, 2 escalated (light stage + heavy answer), 2 heavy by rule, 1 degraded light answer
    for i in range(6):
        a.add_result(rec(f"l{i}", conf=0.9, total=10), NOW)
    for i in range(2):
        a.add_result(rec(f"e{i}", final=False, conf=0.2), NOW)
        a.add_result(rec(f"e{i}", "heavy", escalated=True, total=300), NOW)
    for i in range(2):
        a.add_result(rec(f"h{i}", "heavy", total=250, chars=120), NOW)
    a.add_result(rec("d0", degraded=True, chars=200), NOW)
    w = a.window(NOW)
    assert w.text_finals == 11
    assert w.heavy_share == pytest.approx(4 / 11)
    assert w.rule_heavy_share == pytest.approx(2 / 11)
    assert w.escalated_share == pytest.approx(2 / 11)
    assert w.degraded_share == pytest.approx(1 / 11)
    light, heavy = w.tiers["light"], w.tiers["heavy"]
    assert light.finals == 7 and light.results == 9
    assert light.escalation_rate == pytest.approx(2 / 8)  # of the 8 light results that could escalate
    assert heavy.escalation_rate == pytest.approx(2 / 4)
    assert light.degradation_rate == pytest.approx(1 / 7)
    assert w.confidence.count == 8 and w.chars.count == 11
    assert heavy.p95_ms == pytest.approx(300, rel=0.03) and light.p50_ms == pytest.approx(10, rel=0.03)
    assert light.batch_mean == 4 and light.queue_p95_ms == pytest.approx(2, rel=0.03)
    assert w.models["light/light-m"].results == 9



def oos(r: dict[str, Any], score: float, *, abstained: bool = False, handover: str | None = None) -> dict[str, Any]:
    """`r` with the out-of-scope fields of issue 20 (a final stage that abstained hands over: `handover` why)."""
    r = {**r, "oos_score": score, "abstained": abstained}
    if handover is not None:
        r.update(handover=True, handover_reason=handover)
    return r


def test_window_counts_abstentions_and_hand_overs_per_tier() -> None:
    a = Aggregator(AggConfig(window_ms=10_000, hop_ms=1_000))
    for i in range(5):  # in scope, answered by light
        a.add_result(oos(rec(f"l{i}"), 0.1), NOW)
    for i in range(3):  # light abstained: escalated; heavy answered two, handed one over
        a.add_result(oos(rec(f"a{i}", final=False), 0.9, abstained=True), NOW)
    a.add_result(oos(rec("a0", "heavy", escalated=True), 0.2), NOW)
    a.add_result(oos(rec("a1", "heavy", escalated=True), 0.3), NOW)
    a.add_result(oos(rec("a2", "heavy", escalated=True), 0.95, abstained=True, handover="out_of_scope"), NOW)
    a.add_result(oos(rec("d0", degraded=True), 0.8, abstained=True, handover="out_of_scope"), NOW)  # last stage
    a.add_result(oos(rec("m0", "multimodal"), 0.7, abstained=True, handover="unreadable"), NOW)
    a.add_result(oos(rec("s0", "heavy", final=False, shadow=True), 0.99, abstained=True), NOW)  # answers nobody
    a.add_result(rec("old"), NOW)  # an older worker's record: score 0, no hand-over
    w = a.window(NOW)
    light, heavy, mm = w.tiers["light"], w.tiers["heavy"], w.tiers["multimodal"]
    assert (light.abstained, heavy.abstained, mm.abstained) == (4, 1, 1)
    assert light.abstention_rate == pytest.approx(4 / 10)  # of light's 10 stage results
    assert (light.handovers, heavy.handovers, mm.handovers) == (1, 1, 1)
    assert light.handover_reasons == {"out_of_scope": 1} and mm.handover_reasons == {"unreadable": 1}
    assert w.finals == 11 and w.handovers == 3 and w.handover_share == pytest.approx(3 / 11)
    # the scores the hand-over threshold was compared with: finals only, shadows and escalated stages apart
    assert w.oos.count == 11 and w.oos.cdf(0.5) == pytest.approx(8 / 11, abs=1e-9)
    # the light abstentions escalated whatever escalate_below was: they sit below any threshold
    assert w.confidence.count == 9 and w.confidence.cdf(0.01) == pytest.approx(3 / 9)


def test_hand_over_counts_survive_a_snapshot_and_old_snapshots_load() -> None:
    a = Aggregator()
    a.add_result(oos(rec("h", "heavy"), 0.9, abstained=True, handover="out_of_scope"), NOW)
    a.add_result(oos(rec("l"), 0.1), NOW)
    snap = orjson.loads(orjson.dumps(a.to_json()))
    b = Aggregator.from_json(snap)
    w = b.window(NOW)
    assert w.handovers == 1 and w.tiers["heavy"].handover_reasons == {"out_of_scope": 1} and w.oos.count == 2
    b.merge(Aggregator.from_json(snap))
    assert b.window(NOW).tiers["heavy"].handover_reasons == {"out_of_scope": 2}
    for bucket in snap["buckets"]:  # a snapshot from before issue 20
        del bucket["oos"]
        for t in bucket["tiers"].values():
            for k in ("handovers", "abstained", "handover_reasons"):
                t.pop(k, None)
    old = Aggregator.from_json(snap).window(NOW)
    assert old.finals == 2 and old.handovers == 0 and old.oos.count == 0

def test_window_hops_and_expires() -> None:
    a = Aggregator(AggConfig(window_ms=10_000, hop_ms=2_000))
    a.add_result(rec("old", at=NOW - 7_000), NOW)
    a.add_result(rec("new", at=NOW), NOW)
    a.add_result(rec("late", at=NOW - 20_000), NOW)
    assert a.window(NOW).text_finals == 2 and a.late == 1
    assert a.window(NOW, span_ms=2_000).text_finals == 1
    a.expire(NOW + 4_000)
    assert a.window(NOW + 4_000).text_finals == 1 and len(a.buckets) == 1
    assert a.observed == 3


def test_future_and_missing_event_times_count_now() -> None:
    a = Aggregator()
    a.add_result(rec("f", at=NOW + 3_600_000), NOW)
    a.add_result(rec("z", at=0), NOW)
    assert a.window(NOW).text_finals == 2


def test_accuracy_from_inline_labels() -> None:
    a = Aggregator()
    a.add_result(rec("1", intent="a", label="a"), NOW)
    a.add_result(rec("2", intent="a", label="b"), NOW)
    a.add_result(rec("3", intent="a"), NOW)
    w = a.window(NOW)
    assert w.tiers["light"].accuracy == 0.5 and w.labeled == 2 and w.accuracy == 0.5
    assert w.models["light/light-m"].accuracy == 0.5


def test_label_before_and_after_its_result() -> None:
    a = Aggregator()
    assert a.add_label({"request_id": "early", "intent": "x"}, NOW)
    a.add_result(rec("early", intent="x"), NOW + 10)
    a.add_result(rec("late", intent="x"), NOW + 20)  # labels flow, so it waits for its label
    assert "late" in a.awaiting
    a.add_label({"request_id": "late", "intent": "y", "rating": 2}, NOW + 30)
    w = a.window(NOW + 30)
    light = w.tiers["light"]
    assert light.labeled == 2 and light.accuracy == 0.5
    assert light.rating == 2
    assert a.labeled == 2 and not a.awaiting


def test_results_do_not_wait_when_no_labels_flow_and_joins_expire() -> None:
    a = Aggregator(AggConfig(label_ttl_ms=1_000))
    a.add_result(rec("1"), NOW)
    assert not a.awaiting
    a.add_label({"request_id": "other", "intent": "x"}, NOW)
    a.add_result(rec("2"), NOW)
    assert "2" in a.awaiting
    a.expire(NOW + 5_000)
    assert not a.awaiting and not a.labels


def test_invalid_records_are_counted_not_raised() -> None:
    a = Aggregator()
    assert not a.add_result({"request_id": "x"}, NOW)
    assert not a.add_label({"request_id": "x"}, NOW)
    assert not a.add_label({"intent": "x"}, NOW)
    assert a.invalid == 3


def test_shadow_agreement_both_orders() -> None:
    a = Aggregator()
    a.shadow_rate = 1.0
    a.add_result(rec("s1", intent="a"), NOW)  # light answer first
    a.add_result(rec("s1", "heavy", final=False, shadow=True, intent="a"), NOW)
    a.add_result(rec("s2", "heavy", final=False, shadow=True, intent="b"), NOW)  # shadow first
    a.add_result(rec("s2", intent="a"), NOW)
    light = a.window(NOW).tiers["light"]
    assert light.agreed == 2 and light.agreement == 0.5
    assert list(a.recent["light/light-m"].agree) == [1, 0]
    assert a.window(NOW).text_finals == 2  # shadows are never answers


def test_light_answers_outside_the_shadow_sample_are_not_kept() -> None:
    a = Aggregator()
    a.shadow_rate = 0.0
    a.add_result(rec("x"), NOW)
    assert not a.light


def test_since_change_counts_only_newer_versions() -> None:
    a = Aggregator()
    a.track_since(3)
    a.add_result(rec("old", version=2, label="a"), NOW)
    a.add_result(rec("new", "heavy", version=3, label="b", total=900), NOW)
    a.add_result(rec("newer", version=4, label="a"), NOW)
    after = a.after_change()
    assert after is not None
    assert (after.version, after.results, after.heavy, after.labeled) == (3, 2, 1, 2)
    assert after.accuracy == 0.5 and after.heavy_p95_ms == pytest.approx(900, rel=0.03)
    a.track_since(None)
    assert a.after_change() is None


def test_offsets_skip_what_was_processed() -> None:
    a = Aggregator()
    assert a.fresh("t:0", 5) and not a.fresh("t:0", 5) and not a.fresh("t:0", 3)
    assert a.fresh("t:0", 6) and a.fresh("t:1", 0)


def test_offsets_of_a_recreated_topic_are_not_skipped() -> None:
    a = Aggregator()
    assert a.fresh("t:0", 100, NOW) and a.fresh("t:0", 101, NOW + 5)
    assert not a.fresh("t:0", 50, NOW + 2)  # a re-delivery: no newer than what was seen
    assert a.fresh("t:0", 0, NOW + 60_000)  # a new record at a low offset: the topic was recreated
    assert a.fresh("t:0", 1, NOW + 60_001) and not a.fresh("t:0", 1, NOW + 60_001)


def test_snapshot_round_trip_and_merge() -> None:
    a = Aggregator(AggConfig(window_ms=10_000, hop_ms=1_000))
    a.shadow_rate = 1.0
    a.add_label({"request_id": "w", "intent": "x"}, NOW)
    for i in range(50):
        a.add_result(rec(f"r{i}", conf=i / 50, label="a" if i % 2 else None, at=NOW - (i % 5) * 1000), NOW)
    a.add_result(rec("q", "heavy", final=False, shadow=True), NOW)
    a.track_since(1)
    a.fresh("t:0", 41)
    b = Aggregator.from_json(orjson.loads(orjson.dumps(a.to_json())), a.cfg)
    assert _same(b, a)
    assert b.to_json() == a.to_json()
    assert b.offsets == {"t:0": (41, 0)} and b.after_change() == a.after_change()
    b.merge(a)
    assert b.window(NOW).text_finals == 2 * a.window(NOW).text_finals
    assert b.observed == 2 * a.observed
    with pytest.raises(ValueError):
        Aggregator.from_json({"v": 99})


def _same(x: Aggregator, y: Aggregator) -> bool:
    wx, wy = x.window(NOW), y.window(NOW)
    return wx.tiers == wy.tiers and wx.heavy_share == wy.heavy_share and wx.confidence.count == wy.confidence.count


def test_pending_joins_are_bounded() -> None:
    a = Aggregator(AggConfig(max_pending=10))
    for i in range(25):
        a.add_label({"request_id": f"l{i}", "intent": "x"}, NOW)
    assert len(a.labels) == 10 and "l24" in a.labels and a.dropped == 15


def test_last_n_per_model() -> None:
    a = Aggregator(AggConfig(last_n=3))
    for i in range(5):
        a.add_result(rec(f"{i}", total=float(i), label="a", intent="a" if i < 4 else "b"), NOW)
    r = a.recent["light/light-m"]
    assert list(r.latency) == [2.0, 3.0, 4.0] and list(r.correct) == [1, 1, 0]


def test_agent_state_survives_a_restart_and_counts_nothing_twice() -> None:
    from pipeline.agents.feedback import Feedback
    from pipeline.settings import Settings

    s = Settings(topic_prefix="t.", feedback_window_s=60)
    first = Feedback(s)
    first.agg.shadow_rate = 1.0
    rows = [orjson.dumps(rec(f"r{i}", label="a" if i % 3 else None, intent="a")) for i in range(30)]
    first.add("t.labels", 0, 0, orjson.dumps({"request_id": "seen", "intent": "a"}), NOW, NOW)
    for off, raw in enumerate(rows):
        first.add("t.results", off % 2, off, raw, NOW, NOW + off)
    first.add("t.results", 0, 99, b"not json", NOW, NOW)
    snap = first.snapshot(NOW)

    second = Feedback(s)
    second.restore(snap)
    assert second.restored and second.agg.to_json() == first.agg.to_json()
    for off, raw in enumerate(rows[:10]):  # re-delivered after the restart: skipped
        second.add("t.results", off % 2, off, raw, NOW, NOW + off)
    second.add("t.results", 1, 31, orjson.dumps(rec("new")), NOW, NOW + 31)
    assert second.agg.observed == first.agg.observed + 1
    assert second.agg.invalid == 1
    w = second.measure(NOW)[0]
    assert w.text_finals == 31 and w.labeled == 20


def test_the_agent_leaves_replayed_results_out_of_the_statistics() -> None:
    """A backfill's answers wait behind its duty cycle (a tierflow up replaying a file measured light "p95" 100 s
    and the controller wrote 14 threshold versions in 3 minutes on it): the controller steers live traffic only."""
    from pipeline.agents.feedback import Feedback
    from pipeline.settings import Settings

    fb = Feedback(Settings(topic_prefix="t."))
    fb.add("t.results", 0, 0, orjson.dumps({**rec("live", total=20.0)}), NOW, NOW)
    fb.add("t.results", 0, 1, orjson.dumps({**rec("old", total=100_000.0), "replay": True}), NOW, NOW)
    assert (fb.agg.observed, fb.replays_ignored) == (1, 1)
    light = fb.measure(NOW)[0].tier("light")
    assert light is not None and light.p95_ms is not None and light.p95_ms < 100

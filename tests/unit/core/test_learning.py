"""The learning loop's decisions: what becomes an example (and the poisoning guards), promotion on a paired
interval, rollback on live bounds."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.learning import (
    Example,
    ExampleStore,
    Guards,
    LiveRecord,
    PromotionPolicy,
    RetrainPolicy,
    RollbackPolicy,
    Source,
    Verdict,
    crossfit_folds,
    decide_promotion,
    decide_rollback,
    fold_of,
    paired_delta,
    retrain_due,
)

LABELS = frozenset({"track_order", "cancel_order", "get_refund"})
T0 = 1_700_000_000_000


def store(**guards: float) -> ExampleStore:
    return ExampleStore(LABELS, Guards(**guards))  # type: ignore[arg-type]


def test_a_label_replaces_heavys_guess_and_a_second_heavy_answer_is_a_duplicate() -> None:
    s = store()
    assert s.offer("r1", "where is it", "cancel_order", Source.HEAVY, "u1", T0, 0.9) is Verdict.ACCEPTED
    assert s.offer("r1", "where is it", "track_order", Source.HEAVY, "u1", T0, 0.95) is Verdict.DUPLICATE
    assert s.offer("r1", "where is it", "track_order", Source.LABEL, "u1", T0) is Verdict.REPLACED
    assert s.examples["r1"].intent == "track_order" and s.examples["r1"].source is Source.LABEL
    # a replayed heavy answer after the label changes nothing
    assert s.offer("r1", "where is it", "cancel_order", Source.HEAVY, "u1", T0, 0.99) is Verdict.DUPLICATE
    assert len(s.examples) == 1 and s.per_user["u1"] == 1 and s.n_held_out + s.n_training == 1


def test_unsure_heavy_unknown_intents_missing_text_and_chinese_are_refused() -> None:
    s = store(heavy_floor=0.8)
    assert s.offer("a", "x", "track_order", Source.HEAVY, "u", T0, 0.79) is Verdict.BELOW_FLOOR
    assert s.offer("b", "x", "transfer_money", Source.LABEL, "u", T0) is Verdict.UNKNOWN_INTENT
    assert s.offer("c", None, "track_order", Source.LABEL, "u", T0) is Verdict.NO_TEXT
    assert s.offer("d", "我的订单", "track_order", Source.LABEL, "u", T0, lang="zh") is Verdict.OTHER_SCRIPT
    assert not s.examples


def test_one_user_flooding_one_wrong_label_is_capped_at_per_user() -> None:
    """The adversarial case: one user sends 10,000 labels saying every message is a refund."""
    s = store(per_user=20, per_minute=10_000)
    for i in range(10_000):
        s.offer(f"evil-{i}", f"where is my order {i}", "get_refund", Source.LABEL, "mallory", T0 + i)
    honest = [s.offer(f"ok-{i}", f"where is my order {i}", "track_order", Source.LABEL, f"user-{i}", T0 + i)
              for i in range(200)]
    assert all(v is Verdict.ACCEPTED for v in honest)
    poisoned = [e for e in s.examples.values() if e.user == "mallory"]
    assert len(poisoned) == 20
    assert s.counts[Verdict.USER_CAP] == 10_000 - 20
    # the flood is a tenth of what the honest users taught: the model sees the truth
    assert sum(e.intent == "track_order" for e in s.examples.values()) == 10 * len(poisoned)


def test_the_per_minute_cap_resets_each_minute() -> None:
    s = store(per_minute=5, per_user=1000)
    verdicts = [s.offer(f"r{i}", "t", "track_order", Source.LABEL, f"u{i}", T0) for i in range(8)]
    assert verdicts.count(Verdict.ACCEPTED) == 5 and verdicts.count(Verdict.RATE_CAP) == 3
    assert s.offer("later", "t", "track_order", Source.LABEL, "v", T0 + 60_000) is Verdict.ACCEPTED


def test_the_window_drops_the_oldest_and_frees_their_users_quota() -> None:
    s = store(window=100, per_user=1000, window_ms=10_000)
    for i in range(150):
        s.offer(f"r{i}", "t", "track_order", Source.LABEL, "u", T0 + i)
    assert len(s.examples) == 100 and next(iter(s.examples)) == "r50" and s.per_user["u"] == 100
    assert s.n_held_out == len(s.held_out()) > 0 and s.n_training == len(s.training())  # kept across the drops
    s.offer("late", "t", "track_order", Source.LABEL, "u", T0 + 20_000)
    assert list(s.examples) == ["late"]
    assert s.n_held_out == len(s.held_out()) and s.n_training == len(s.training())


def test_held_out_ids_are_never_training_examples() -> None:
    s = store(holdout=0.25, per_user=10**6, per_minute=10**6)
    for i in range(2000):
        s.offer(f"r{i}", "t", "track_order", Source.LABEL, "u", T0)
    held = {e.request_id for e in s.held_out()}
    train = {e.request_id for e in s.take_training()}
    assert not held & train and len(held) + len(train) == 2000
    assert (s.n_held_out, s.n_training) == (len(held), len(train))
    assert 0.2 < len(held) / 2000 < 0.3
    assert s.new_training == 0


def test_paired_delta_interval_matches_the_formula() -> None:
    cand = [True] * 80 + [False] * 20
    live = [True] * 70 + [False] * 30
    d = paired_delta(cand, live)
    diffs = [1] * 10 + [0] * 90
    sd = math.sqrt(sum((x - 0.1) ** 2 for x in diffs) / 99)
    assert d.mean == pytest.approx(0.1)
    assert d.lo == pytest.approx(0.1 - 1.96 * sd / 10) and d.hi == pytest.approx(0.1 + 1.96 * sd / 10)
    assert (d.candidate, d.live) == (0.8, 0.7)


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=300))
def test_the_interval_always_holds_the_mean(pairs: list[tuple[bool, bool]]) -> None:
    d = paired_delta([c for c, _ in pairs], [v for _, v in pairs])
    assert d.lo <= d.mean <= d.hi
    assert d.mean == pytest.approx(d.candidate - d.live)


def test_promotion_needs_evidence_a_clear_win_and_no_labelled_loss() -> None:
    policy = PromotionPolicy(margin=0.0, label_margin=0.0, min_eval=100, min_labels=30)
    rnd = random.Random(0)
    live = [rnd.random() < 0.8 for _ in range(400)]
    better = [lv or rnd.random() < 0.5 for lv in live]  # right wherever live is, and half of the rest
    same = list(live)
    no_labels = paired_delta([], [])
    assert decide_promotion(paired_delta(better, live), no_labels, policy).promote
    assert not decide_promotion(paired_delta(same, live), no_labels, policy).promote
    assert not decide_promotion(paired_delta(better[:50], live[:50]), no_labels, policy).promote  # too few
    worse_on_labels = paired_delta([False] * 60, [True] * 60)  # the labels show it worse
    d = decide_promotion(paired_delta(better, live), worse_on_labels, policy)
    assert not d.promote and "labelled accuracy" in d.why
    # a small labelled slice that cannot tell (its interval holds zero) does not block a candidate shown better
    unsure = paired_delta([True] * 30 + [False] * 35, [True] * 29 + [False] * 36)
    assert unsure.lo < 0 < unsure.hi
    assert decide_promotion(paired_delta(better, live), unsure, policy).promote


def test_cross_fitted_evidence_promotes_a_recipe_shown_better_unless_the_candidate_is_shown_worse() -> None:
    policy = PromotionPolicy(margin=0.0, label_margin=0.0, min_eval=100, min_labels=30)
    rnd = random.Random(1)
    no_labels = paired_delta([], [])

    def pairs(n: int, gain: float) -> tuple[list[bool], list[bool]]:
        live = [rnd.random() < 0.9 for _ in range(n)]
        return [lv or rnd.random() < gain for lv in live], live

    held_c, held_l = pairs(400, 0.05)  # a small gain: the held-out slice alone cannot tell
    held = paired_delta(held_c, held_l)
    assert held.lo <= 0 < held.hi and not decide_promotion(held, no_labels, policy).promote
    fold_c, fold_l = pairs(4000, 0.05)
    pooled = paired_delta(held_c + fold_c, held_l + fold_l)
    d = decide_promotion(held, no_labels, policy, pooled)
    assert pooled.lo > 0 and d.promote and "cross-fitted" in d.why and "n=4400" in d.why
    # the recipe shown better, the candidate itself shown worse on its own held-out answers: refused
    worse = paired_delta([False] * 150 + [True] * 250, [True] * 400)
    d = decide_promotion(worse, no_labels, policy, paired_delta([True] * 4400, [False] * 4400))
    assert not d.promote and "itself is shown worse" in d.why
    # the pooled interval straddling the margin: refused, naming both counts
    d = decide_promotion(held, no_labels, policy, paired_delta(held_c + fold_l, held_l + fold_l))
    assert not d.promote and "cross-fitted" in d.why and "400 held out, 4000 new by fold" in d.why
    # no fold examples (the pooled evidence is the held-out slice): the held-out rule
    assert not decide_promotion(held, no_labels, policy, held).promote
    # too few held out: no amount of fold evidence decides
    few = paired_delta(held_c[:50], held_l[:50])
    assert "too little evidence" in decide_promotion(few, no_labels, policy, pooled).why


def test_crossfit_folds_are_heavys_answers_newer_than_the_live_model_split_by_text() -> None:
    def ex(rid: str, text: str, source: Source, at: int) -> Example:
        return Example(rid, text, "track_order", source, "u", at, held_out=False)

    old = [ex(f"o{i}", f"old message {i}", Source.HEAVY, T0 + i) for i in range(50)]
    new = [ex(f"n{i}", f"new message {i}", Source.HEAVY, T0 + 1000 + i) for i in range(500)]
    label = ex("l", "a labelled one", Source.LABEL, T0 + 2000)
    twice = [ex("t1", "Where is  my order?", Source.HEAVY, T0 + 3000), ex("t2", "where is my ORDER?", Source.HEAVY,
                                                                           T0 + 3001)]
    examples = [*old, *new, label, *twice]
    folds = crossfit_folds(examples, T0 + 999, 5)
    assert all(f is None for f in folds[:50])  # the live model trained on these
    assert folds[len(old) + len(new)] is None  # a label may replace a guess the live model saw
    assert {f for f in folds[50:550]} == {0, 1, 2, 3, 4}
    assert min(folds[50:550].count(k) for k in range(5)) >= 60  # roughly even
    assert folds[-1] == folds[-2] == fold_of("where is my order?", 5)  # one text, one fold
    assert all(f is not None for f in crossfit_folds(examples[:50], None, 5))  # a live model trained on none
    assert crossfit_folds(examples, None, 1) == [None] * len(examples)  # off


def test_rollback_when_escalations_rise_or_agreement_falls_past_the_bound() -> None:
    policy = RollbackPolicy(escalation_rise=0.10, agreement_drop=0.10, min_results=100, min_pairs=30)
    baseline = {"escalation_rate": 0.20, "agreement": 0.90}
    rec = LiveRecord()
    for i in range(99):
        rec.result(escalated=i % 2 == 0)  # 50%: but too few results yet
    assert decide_rollback(rec, baseline, policy) is None
    rec.result(escalated=True)
    assert "escalation rate" in (decide_rollback(rec, baseline, policy) or "")
    ok = LiveRecord()
    for i in range(200):
        ok.result(escalated=i % 5 == 0)  # 20%: as the parent
        ok.pair(agreed=i % 10 != 0)  # 90%
    assert decide_rollback(ok, baseline, policy) is None
    bad = LiveRecord()
    for i in range(40):
        bad.pair(agreed=i % 2 == 0)
    assert "agreement" in (decide_rollback(bad, baseline, policy) or "")
    assert decide_rollback(bad, {"escalation_rate": None, "agreement": None}, policy) is None


def test_a_retraining_waits_for_enough_new_data_and_a_grown_set() -> None:
    p = RetrainPolicy(every=500, growth=0.25, every_s=600.0)
    assert not retrain_due(499, 0, 10.0, p) and retrain_due(500, 0, 10.0, p)  # the first: `every`
    assert not retrain_due(999, 4000, 10.0, p) and retrain_due(1000, 4000, 10.0, p)  # then 25% more as well
    assert retrain_due(1, 40_000, 600.0, p)  # a full window that moved on: retrained on time
    assert not retrain_due(0, 40_000, 10**6, p)  # nothing new: nothing to learn

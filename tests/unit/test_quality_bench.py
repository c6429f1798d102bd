"""bench/quality: the routing metrics on arrays with known answers, and the `--quick` path end to end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench import quality as q


def arr(*xs: float) -> q.FloatArray:
    return np.array(xs, dtype=np.float64)


# light is right on 0 and 1; heavy on 1, 2 and 3: light 50%, heavy 75%
LIGHT = arr(1, 1, 0, 0)
HEAVY = arr(0, 1, 1, 1)


def test_cascade_curve_escalates_the_least_confident_first() -> None:
    score = arr(0.9, 0.8, 0.1, 0.3)  # message 2 least confident, then 3, then 1, then 0
    curve = q.cascade_curve(LIGHT, HEAVY, score)
    assert curve == pytest.approx([0.50, 0.75, 1.00, 1.00, 0.75])


def test_cascade_curve_averages_over_ties() -> None:
    # all four tied: no threshold separates them, so every share gets the random expectation
    curve = q.cascade_curve(LIGHT, HEAVY, arr(0.5, 0.5, 0.5, 0.5))
    assert curve == pytest.approx(q.random_accuracy(0.5, 0.75, np.arange(5) / 4))
    # two tied at the bottom, one helpful (2) and one not (0): half a message gained at k = 1
    curve = q.cascade_curve(LIGHT, HEAVY, arr(0.1, 0.8, 0.1, 0.9))
    assert curve == pytest.approx([0.50, 0.50, 0.50, 0.50, 0.75])


def test_cascade_curve_rejects_mismatched_arrays() -> None:
    with pytest.raises(ValueError):
        q.cascade_curve(LIGHT, HEAVY, arr(0.1, 0.2))


def test_at_shares_interpolates_between_messages() -> None:
    curve = arr(0.5, 0.75, 1.0, 1.0, 0.75)
    assert q.at_shares(curve, [0.0, 0.125, 0.25, 1.0]) == pytest.approx([0.5, 0.625, 0.75, 0.75])


def test_random_router_is_the_straight_line() -> None:
    assert q.random_accuracy(0.9, 0.94, [0.0, 0.25, 1.0]) == pytest.approx([0.9, 0.91, 0.94])


def test_pgr_apgr_and_cpt() -> None:
    assert q.pgr(arr(0.5, 0.625, 0.75), 0.5, 0.75) == pytest.approx([0.0, 0.5, 1.0])
    # the random router recovers the gap linearly: APGR 1/2, CPT(x) = x
    line = q.random_accuracy(0.5, 0.75, np.arange(101) / 100)
    assert q.apgr(line, 0.5, 0.75) == pytest.approx(0.5)
    assert q.cpt(line, 0.5, 0.75, 0.8) == pytest.approx(0.8)
    # the oracle-ordered 4-message cascade: PGR 0, 1, 2, 2, 1 at shares 0, 1/4, .. 1
    curve = q.cascade_curve(LIGHT, HEAVY, arr(0.9, 0.8, 0.1, 0.3))
    assert q.apgr(curve, 0.5, 0.75) == pytest.approx((0 + 1) / 8 + (1 + 2) / 8 + (2 + 2) / 8 + (2 + 1) / 8)
    assert q.cpt(curve, 0.5, 0.75, 0.95) == pytest.approx(0.25)
    assert q.cpt(curve, 0.5, 0.75, 2.5) is None
    with pytest.raises(ValueError):
        q.pgr(arr(0.5), 0.8, 0.8)


def test_router_scores_rank_unsure_rows_low() -> None:
    probs = np.array([[0.9, 0.05, 0.05], [0.5, 0.4, 0.1], [0.34, 0.33, 0.33]])
    for name, s in q.router_scores(probs).items():
        assert s[0] > s[1] > s[2], name
    scores = q.router_scores(probs)
    assert scores["confidence"] == pytest.approx([0.9, 0.5, 0.34])
    assert scores["margin"] == pytest.approx([0.85, 0.1, 0.01])


def test_costs_and_thresholds() -> None:
    # cascade: every message pays light, escalated ones heavy too; one-model routers pay one each
    assert q.cascade_cost_ms(arr(0.0, 0.1), 0.5, 20.0) == pytest.approx([500.0, 2500.0])
    assert q.split_cost_ms(arr(0.0, 0.1, 1.0), 0.5, 20.0) == pytest.approx([500.0, 2450.0, 20000.0])
    conf = arr(0.9, 0.2, 0.5, 0.7)
    t = q.threshold_for_share(conf, 0.5)
    assert (conf < t).mean() == 0.5
    assert q.threshold_for_share(conf, 1.0) == 1.0


def test_bootstrap_finds_a_better_score_and_not_an_equal_one() -> None:
    rng = np.random.default_rng(0)
    n = 400
    light = (rng.random(n) < 0.8).astype(np.float64)
    heavy = np.maximum(light, (rng.random(n) < 0.7).astype(np.float64))
    oracle = light - heavy + rng.random(n) * 0.01  # light-wrong-heavy-right first
    noise = rng.random(n)
    d, lo, hi = q.bootstrap_apgr_diff(light, heavy, noise, oracle, rounds=100, seed=1)
    assert d > 0 and lo > 0
    d, lo, hi = q.bootstrap_apgr_diff(light, heavy, oracle, oracle, rounds=50, seed=1)
    assert d == 0 and lo == 0 == hi


def test_controller_replay_holds_a_budget_with_the_real_controller() -> None:
    # 3,000 messages, light confidence uniform, lengths 10..109: the controller must move both knobs
    rng = np.random.default_rng(3)
    n = 3000
    conf = rng.random(n)
    lengths = rng.integers(10, 110, n)
    intents = ["a"] * n
    r = q.replay_controller(conf, lengths, intents, intents, intents, budget=0.15, rate=40.0, seed=1)
    assert r.changes >= 1
    assert r.final.length_threshold > 50  # the default rule alone sends ~59% heavy
    heavy = (lengths > r.final.length_threshold) | (conf < r.final.escalate_below)
    assert r.test_share == pytest.approx(heavy.mean())
    assert abs(r.test_share - 0.15) <= 0.03
    assert r.test_accuracy == 1.0


def test_quick_run_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    def no_write(title: str, body: str) -> None:
        raise AssertionError("BENCHMARKS.md written without --write")

    monkeypatch.setattr(q, "write_section", no_write)
    png = tmp_path / "quality.png"
    assert q.main(["--quick", "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    out = capsys.readouterr().out
    assert "random sample of 600" in out
    assert "| confidence (tierflow today) |" in out
    for target in ("hybrid accuracy >= 93.5%", "CPT(95%) <= 12%", "above the random router",
                   "above the length-rule sweep", "controller with a 15% budget"):
        assert any(target in line and line.startswith(("PASS", "FAIL")) for line in out.splitlines()), target
    # operating points: chosen on one half of the sample, measured on the other, compared as it holds
    assert "seeded random half of the sample (validation: 300 messages, seed 7)" in out
    assert "| most accurate with <= 20% heavy |" in out
    peak = next(line for line in out.splitlines() if line.startswith("The most accurate cut on the validation half"))
    assert any(w in peak for w in ("points above heavy-only", "points below heavy-only", "equal to heavy-only"))


def test_split_halves_is_seeded_disjoint_and_complete() -> None:
    val, test = q.split_halves(11, seed=3)
    assert len(val) == 5 and len(test) == 6
    assert sorted([*val, *test]) == list(range(11))
    again, _ = q.split_halves(11, seed=3)
    assert list(val) == list(again)
    other, _ = q.split_halves(1000, seed=4)
    assert list(other) != list(q.split_halves(1000, seed=5)[0])


def test_threshold_sweep_gives_real_cuts_that_never_split_ties() -> None:
    score = arr(0.9, 0.1, 0.1, 0.3)
    ts, shares, accs = q.threshold_sweep(score, LIGHT, HEAVY)
    assert list(ts) == [0.1, 0.3, 0.9, np.inf]
    assert shares == pytest.approx([0.0, 0.5, 0.75, 1.0])  # the two 0.1 go heavy together
    assert accs == pytest.approx([0.5, 0.75, 1.0, 0.75])
    for t, h, a in zip(ts, shares, accs, strict=True):
        assert q.at_threshold(score, LIGHT, HEAVY, float(t)) == pytest.approx((h, a))


def test_operating_point_rules() -> None:
    shares = arr(0.0, 0.1, 0.2, 0.3, 1.0)
    accs = arr(0.90, 0.93, 0.93, 0.95, 0.94)
    assert q.most_accurate(shares, accs, 0.2) == 1  # a tie: the smaller share
    assert q.most_accurate(shares, accs) == 3
    assert q.first_reaching(shares, accs, 0.93) == 1
    assert q.first_reaching(shares, accs, 0.96) is None


def test_operating_points_are_chosen_on_one_half_and_measured_on_the_other() -> None:
    # On the validation half (set up below) escalating the 0.2-scored messages pays;
    # on the other half those are the ones heavy gets wrong. Reading the best point off the measured
    # data would report 100%; chosen on validation, the test half pays for it.
    n = 40
    score = np.tile(arr(0.2, 0.8), n // 2)
    light = np.ones(n)
    heavy = np.ones(n)
    val, test = q.split_halves(n, seed=0)
    light[val[score[val] == 0.2]] = 0.0  # validation: light wrong where unsure, heavy right
    heavy[test[score[test] == 0.2]] = 0.0  # test: heavy wrong where light was unsure
    lengths = np.full(n, 10, dtype=np.int64)
    h = q.held_out(score, light, heavy, lengths, seed=0)
    assert (h.n_val, h.n_test) == (20, 20)
    p = h.peak
    assert p.threshold == pytest.approx(0.8) and p.val_acc == 1.0
    assert p.test_share == pytest.approx((score[test] < 0.8).mean())
    assert p.test_acc == pytest.approx(1.0 - p.test_share)  # measured on test, not copied from validation
    assert h.test_heavy < 1.0 == h.test_light
    assert q.compare(p.test_acc, h.test_heavy) == "equal to"
    assert q.compare(0.95, 0.94) == "1.00 points above"
    assert q.compare(0.93, 0.94) == "1.00 points below"


def test_report_says_below_heavy_only_when_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # a data set where the cascade never beats heavy-only: no "above heavy-only" claim
    rng = np.random.default_rng(0)
    n = 400
    heavy = np.ones(n)
    light = (rng.random(n) < 0.8).astype(np.float64)
    score = rng.random(n)  # an uninformative score
    lengths = rng.integers(10, 100, n)
    h = q.held_out(score, light, heavy, lengths.astype(np.int64), seed=1)
    ev = SimpleNamespace(held=h, curves={"confidence": q.cascade_curve(light, heavy, score)}, n=n)
    text = "\n".join(q._held_out_lines(ev, quick=False))  # type: ignore[arg-type]
    assert "above heavy-only" not in text
    assert "below heavy-only" in text or "equal to heavy-only" in text
    assert "validation: 200 messages, seed 1" in text

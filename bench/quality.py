"""Quality and cost of the light/heavy cascade on BANKING77, against a random router and the length rule.

Both packaged models score the BANKING77 test set once (CPU, worker batch sizes, timed). From the two
correctness vectors every routing policy's accuracy follows exactly, without running the models again:

- the cascade (tierflow): the messages with the lowest light confidence go to heavy, i.e.
  `escalate_below` swept so that any heavy share 0..100% is reached; other router scores built from
  the light model's output alone (margin top1 - top2, entropy, log-ratio top1/top2) are swept the same
  way and compared by APGR with a paired bootstrap;
- a random router at the same heavy share (its exact expectation, a straight line);
- the design article's length rule: longer than T characters -> heavy, one point at T = 50 and the
  sweep over T.

Ties in a score (several messages at one threshold) are averaged: the accuracy at a share inside a tie
is the expectation under a random tie-break, the same as interpolating between the thresholds.

Routing-literature metrics (RouteLLM): PGR(h) = (acc(h) - acc_light) / (acc_heavy - acc_light), APGR its
area over heavy share 0..1 (random router: 0.5), CPT(x) the smallest heavy share with PGR >= x.
Cost per 1,000 messages is CPU ms from the measured batched ms/message of each model: the cascade pays
the light pass for every message plus the heavy pass for the escalated ones; the random router and the
length rule run one model per message.

Operating points (an escalate_below that is most accurate within the heavy-share target, the first to
reach the accuracy target, CPT(95%), the most accurate overall) are chosen on a seeded random half of
the test set and measured on the other half: the maximum of a curve read on the data it is measured
on is optimistic. The comparison with heavy-only is computed, never assumed.

Then the controller check: the test set replayed as a stream (shuffled, fixed seed) through the real
`pipeline.core.stats.Aggregator` and `pipeline.core.controller.decide`, in process, starting from the default
thresholds with a 15% heavy budget.

    python -m bench.quality [--quick] [--write] [--png PATH]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.common import ROOT, write_section
from pipeline.agents.feedback import agg_config, controller_config
from pipeline.contracts.topics import Tier
from pipeline.core.controller import ControllerState, Decision, applied, decide
from pipeline.core.features import routed_length
from pipeline.core.stats import Aggregator
from pipeline.core.thresholds import Thresholds
from pipeline.settings import FeedbackSection, HeartbeatSection, Settings

FloatArray = npt.NDArray[np.float64]
TEST_CSV = ROOT / "workers" / "data" / "banking77" / "test.csv"
PNG = ROOT / "bench" / "quality.png"
TITLE = "Quality and cost on BANKING77"

TABLE_SHARES = (0.0, 0.05, 0.10, 0.12, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50, 1.0)
GRID = np.round(np.arange(101) / 100.0, 2)  # heavy shares 0..100% in 1% steps
ARTICLE_LENGTH = 50  # the design article's rule: longer than 50 characters -> heavy
NO_LENGTH_RULE = 32_768  # length_threshold's upper bound: no text is longer, the rule never fires

# targets of issue 8
TARGET_ACC, TARGET_SHARE = 0.935, 0.20
TARGET_CPT95 = 0.12
CONTROLLER_BUDGET, CONTROLLER_TOLERANCE = 0.15, 0.02

# the published plain cascade (char TF-IDF + LR light, MiniLM + LR heavy) quoted beside our numbers
ANCHOR = {"light": 0.909, "heavy": 0.929, 0.10: 0.924, 0.20: 0.932, 0.25: 0.933, "cpt95": 0.17,
          "length50_share": 0.387, "length50_acc": 0.915, "random25": 0.914}


# --------------------------------------------------------------------------- pure metrics
def cascade_curve(light_correct: FloatArray, heavy_correct: FloatArray, score: FloatArray) -> FloatArray:
    """Accuracy when the k lowest-`score` messages go heavy, for k = 0..n (n + 1 values).

    Messages with equal scores cannot be split by a threshold: inside a tie the accuracy is the
    expectation under a random tie-break (linear between the tie's ends).
    """
    light = np.asarray(light_correct, dtype=np.float64)
    heavy = np.asarray(heavy_correct, dtype=np.float64)
    s = np.asarray(score, dtype=np.float64)
    n = len(s)
    if not n == len(light) == len(heavy):
        raise ValueError("score and correctness arrays differ in length")
    if n == 0:
        raise ValueError("no messages")
    order = np.argsort(s, kind="stable")
    gain = np.concatenate([[0.0], np.cumsum(heavy[order] - light[order])])
    ss = s[order]
    ends = np.concatenate([[0], np.nonzero(ss[1:] != ss[:-1])[0] + 1, [n]])
    tied = np.interp(np.arange(n + 1), ends, gain[ends])
    out: FloatArray = (light.sum() + tied) / n
    return out


def at_shares(curve: FloatArray, shares: Sequence[float] | FloatArray) -> FloatArray:
    """A k = 0..n curve read at heavy shares (fractions), linear between whole messages."""
    n = len(curve) - 1
    out: FloatArray = np.interp(np.asarray(shares, dtype=np.float64) * n, np.arange(n + 1), curve)
    return out


def random_accuracy(acc_light: float, acc_heavy: float, shares: Sequence[float] | FloatArray) -> FloatArray:
    """Expected accuracy of a router sending a random share h of messages heavy: a straight line."""
    h = np.asarray(shares, dtype=np.float64)
    out: FloatArray = acc_light + h * (acc_heavy - acc_light)
    return out


def pgr(acc: FloatArray | float, acc_light: float, acc_heavy: float) -> FloatArray:
    """Performance gap recovered: 0 at the light model's accuracy, 1 at the heavy model's."""
    gap = acc_heavy - acc_light
    if gap <= 0:
        raise ValueError(f"PGR needs heavy ({acc_heavy:.4f}) more accurate than light ({acc_light:.4f})")
    out: FloatArray = (np.asarray(acc, dtype=np.float64) - acc_light) / gap
    return out


def apgr(curve: FloatArray, acc_light: float, acc_heavy: float) -> float:
    """Area under PGR over heavy share 0..1 of a k = 0..n curve (trapezoids; random router: 0.5)."""
    p = pgr(curve, acc_light, acc_heavy)
    return float(np.trapezoid(p, dx=1.0 / (len(curve) - 1)))


def cpt(curve: FloatArray, acc_light: float, acc_heavy: float, x: float) -> float | None:
    """Call-performance threshold: the smallest heavy share whose PGR reaches `x` (None: never)."""
    p = pgr(curve, acc_light, acc_heavy)
    hit = np.nonzero(p >= x - 1e-12)[0]
    return float(hit[0]) / (len(curve) - 1) if len(hit) else None


def threshold_for_share(score: FloatArray, share: float) -> float:
    """The `score < threshold` cut that sends (about) `share` of the messages heavy."""
    s = np.sort(np.asarray(score, dtype=np.float64))
    k = round(share * len(s))
    return 1.0 if k >= len(s) else float(s[k])


def router_scores(probs: FloatArray) -> dict[str, FloatArray]:
    """Confidence scores from the light model's probabilities alone; low = unsure = escalate first."""
    p = np.asarray(probs, dtype=np.float64)
    top = np.sort(p, axis=1)
    p1, p2 = top[:, -1], top[:, -2]
    return {
        "confidence": p1,  # what the worker compares with escalate_below
        "margin": p1 - p2,
        "log-ratio": np.log(np.maximum(p1, 1e-30)) - np.log(np.maximum(p2, 1e-30)),
        "neg-entropy": (p * np.log(np.maximum(p, 1e-30))).sum(axis=1),
    }


def cascade_cost_ms(shares: FloatArray | float, light_ms: float, heavy_ms: float) -> FloatArray:
    """CPU ms per 1,000 messages of the cascade: light for all, heavy for the escalated share."""
    out: FloatArray = 1000.0 * (light_ms + np.asarray(shares, dtype=np.float64) * heavy_ms)
    return out


def split_cost_ms(shares: FloatArray | float, light_ms: float, heavy_ms: float) -> FloatArray:
    """CPU ms per 1,000 messages of a router that runs one model per message (random, length rule)."""
    h = np.asarray(shares, dtype=np.float64)
    out: FloatArray = 1000.0 * ((1.0 - h) * light_ms + h * heavy_ms)
    return out


def bootstrap_apgr_diff(light_correct: FloatArray, heavy_correct: FloatArray, base: FloatArray,
                        other: FloatArray, rounds: int, seed: int) -> tuple[float, float, float]:
    """APGR(other) - APGR(base) on the data and its 95% paired-bootstrap interval: (diff, lo, hi)."""
    rng = np.random.default_rng(seed)
    n = len(base)
    diffs = []
    for _ in range(rounds):
        i = rng.integers(0, n, n)
        lc, hc = light_correct[i], heavy_correct[i]
        al, ah = float(lc.mean()), float(hc.mean())
        if ah <= al:
            continue
        diffs.append(apgr(cascade_curve(lc, hc, other[i]), al, ah) - apgr(cascade_curve(lc, hc, base[i]), al, ah))
    al, ah = float(light_correct.mean()), float(heavy_correct.mean())
    d = apgr(cascade_curve(light_correct, heavy_correct, other), al, ah) - \
        apgr(cascade_curve(light_correct, heavy_correct, base), al, ah)
    lo, hi = np.percentile(diffs, [2.5, 97.5]) if diffs else (float("nan"), float("nan"))
    return d, float(lo), float(hi)


# --------------------------------------------------------------------------- held-out operating points
# Reading the best point off the curve it is measured on (its maximum, its first crossing of a target)
# flatters: the choice fits that data's noise. Operating points are chosen on a seeded random half of
# the test set (validation) and measured on the other half (test), as a deployment chooses its
# escalate_below before it sees the traffic it is judged on.
IntArray = npt.NDArray[np.int64]


def split_halves(n: int, seed: int) -> tuple[IntArray, IntArray]:
    """Indices of a seeded random half of 0..n-1 (validation, n // 2) and of the rest (test), sorted."""
    perm = np.random.default_rng(seed).permutation(n)
    k = n // 2
    return np.sort(perm[:k]).astype(np.int64), np.sort(perm[k:]).astype(np.int64)


def threshold_sweep(score: FloatArray, light_correct: FloatArray,
                    heavy_correct: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Every distinct cut `score < t` (t = each distinct score, then +inf: all heavy), as
    (thresholds, heavy shares, accuracies), shares increasing. Ties are never split: a real threshold."""
    s = np.asarray(score, dtype=np.float64)
    light = np.asarray(light_correct, dtype=np.float64)
    heavy = np.asarray(heavy_correct, dtype=np.float64)
    n = len(s)
    if n == 0 or not n == len(light) == len(heavy):
        raise ValueError("score and correctness arrays must be non-empty and of one length")
    order = np.argsort(s, kind="stable")
    ss = s[order]
    ts = np.concatenate([np.unique(ss), [np.inf]])
    k = np.searchsorted(ss, ts, side="left")  # messages with score < t
    gain = np.concatenate([[0.0], np.cumsum(heavy[order] - light[order])])
    shares: FloatArray = k / n
    accs: FloatArray = (light.sum() + gain[k]) / n
    return ts, shares, accs


def at_threshold(score: FloatArray, light_correct: FloatArray, heavy_correct: FloatArray,
                 threshold: float) -> tuple[float, float]:
    """(heavy share, accuracy) when messages with `score < threshold` go heavy."""
    heavy = np.asarray(score, dtype=np.float64) < threshold
    return float(heavy.mean()), float(np.where(heavy, heavy_correct, light_correct).mean())


def most_accurate(shares: FloatArray, accs: FloatArray, max_share: float = 1.0) -> int:
    """Index of the most accurate cut with at most `max_share` heavy (the smallest share on a tie)."""
    ok = np.nonzero(shares <= max_share + 1e-12)[0]
    return int(ok[np.argmax(accs[ok])])


def first_reaching(shares: FloatArray, accs: FloatArray, acc: float) -> int | None:
    """Index of the cut with the smallest heavy share whose accuracy reaches `acc` (None: none does)."""
    hit = np.nonzero(accs >= acc - 1e-12)[0]
    return int(hit[0]) if len(hit) else None


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """An escalate_below chosen on the validation half by `rule`, and what it gives on both halves."""

    rule: str
    threshold: float
    val_share: float
    val_acc: float
    test_share: float
    test_acc: float


@dataclass(frozen=True, slots=True)
class HeldOut:
    """Operating points chosen on the validation half and measured on the test half."""

    seed: int
    n_val: int
    n_test: int
    val_light: float
    val_heavy: float
    test_light: float
    test_heavy: float
    best_within: OperatingPoint  # most accurate with <= TARGET_SHARE heavy
    target: OperatingPoint | None  # smallest share reaching TARGET_ACC
    cpt95: OperatingPoint | None  # smallest share with PGR >= 95% (CPT(95%))
    peak: OperatingPoint  # most accurate at any share
    length_match: OperatingPoint | None  # smallest share reaching the length rule's accuracy
    length50_val: tuple[float, float]  # the > ARTICLE_LENGTH rule: (share, accuracy) on each half
    length50_test: tuple[float, float]

    def test_pgr(self, p: OperatingPoint) -> float:
        """PGR of `p` on the test half (nan where heavy is not more accurate than light there)."""
        if self.test_heavy <= self.test_light:
            return float("nan")
        return float(pgr(p.test_acc, self.test_light, self.test_heavy))


def held_out(score: FloatArray, light_correct: FloatArray, heavy_correct: FloatArray,
             lengths: npt.NDArray[np.int64], seed: int) -> HeldOut:
    """Choose the operating points on a seeded half of the messages; measure them on the other half."""
    val, test = split_halves(len(score), seed)
    sv, lv, hv = score[val], light_correct[val], heavy_correct[val]
    st, lt, ht = score[test], light_correct[test], heavy_correct[test]
    ts, shares, accs = threshold_sweep(sv, lv, hv)

    def point(rule: str, i: int) -> OperatingPoint:
        t = float(ts[i])
        return OperatingPoint(rule, t, float(shares[i]), float(accs[i]), *at_threshold(st, lt, ht, t))

    def maybe(rule: str, i: int | None) -> OperatingPoint | None:
        return None if i is None else point(rule, i)

    al, ah = float(lv.mean()), float(hv.mean())
    long = lengths > ARTICLE_LENGTH
    rule_val = (float(long[val].mean()), float(np.where(long[val], hv, lv).mean()))
    rule_test = (float(long[test].mean()), float(np.where(long[test], ht, lt).mean()))
    return HeldOut(
        seed, len(val), len(test), al, ah, float(lt.mean()), float(ht.mean()),
        point(f"most accurate with <= {TARGET_SHARE:.0%} heavy", most_accurate(shares, accs, TARGET_SHARE)),
        maybe(f"smallest share reaching {TARGET_ACC:.1%}", first_reaching(shares, accs, TARGET_ACC)),
        maybe("smallest share with PGR >= 95% (CPT(95%))",
              first_reaching(shares, accs, al + 0.95 * (ah - al)) if ah > al else None),
        point("most accurate at any share", most_accurate(shares, accs)),
        maybe(f"smallest share reaching the > {ARTICLE_LENGTH} chars rule's accuracy",
              first_reaching(shares, accs, rule_val[1])),
        rule_val, rule_test)


# --------------------------------------------------------------------------- data and models
def load_test(sample: int | None, seed: int, path: Path = TEST_CSV) -> tuple[list[str], list[str]]:
    """(texts, intents) of the BANKING77 test set, or a fixed random sample of it."""
    with path.open(newline="") as f:
        rows = [(r["text"], r["category"]) for r in csv.DictReader(f)]
    if sample is not None and sample < len(rows):
        rows = random.Random(seed).sample(rows, sample)
    return [t for t, _ in rows], [c for _, c in rows]


@dataclass(frozen=True, slots=True)
class Scored:
    """Both models' probabilities on the messages and their measured batched CPU cost."""

    labels: list[str]
    light_probs: FloatArray
    heavy_probs: FloatArray
    light_ms: float  # per message, batches of light_max_batch, median of 3 passes
    heavy_ms: float  # per message, batches of heavy_max_batch, fastest pass
    light_batch: int
    heavy_batch: int
    torch_threads: int
    heavy_runtime: str = "torch"  # what ran the heavy encoder (TIERFLOW_HEAVY_RUNTIME as setup resolved it)


def _batched(fn: Callable[[Sequence[str]], Any], texts: Sequence[str], size: int) -> tuple[FloatArray, float]:
    t0 = time.perf_counter()
    parts = [np.asarray(fn(texts[i : i + size]), dtype=np.float64) for i in range(0, len(texts), size)]
    return np.vstack(parts), (time.perf_counter() - t0) * 1000.0 / len(texts)


def score_models(texts: Sequence[str], heavy_passes: int = 1) -> Scored:
    """Run the packaged light and heavy models on the CPU over `texts`, in worker-sized batches.

    The light model's cost is the median of 3 passes; the heavy model's the fastest of `heavy_passes`
    (other work on a shared machine only ever slows a pass down).
    """
    import torch

    from workers.models.charngram import CharNgramClassifier
    from workers.models.encoder import EncoderClassifier

    s = Settings(domain="banking")  # BANKING77 stays the accuracy benchmark
    light = CharNgramClassifier.from_settings(s, Tier.LIGHT)
    light.setup("cpu")
    heavy = EncoderClassifier.from_settings(s, Tier.HEAVY)
    heavy.setup("cpu")
    if light.labels != heavy.labels:
        raise RuntimeError("the light and heavy artefacts disagree on the label set")
    runs = [_batched(light.probabilities, texts, s.light.max_batch) for _ in range(3)]
    light_probs = runs[0][0]
    light_ms = statistics.median(ms for _, ms in runs)
    heavy_probs, heavy_ms = _batched(heavy.probabilities, texts, s.heavy.max_batch)
    for _ in range(heavy_passes - 1):
        heavy_ms = min(heavy_ms, _batched(heavy.probabilities, texts, s.heavy.max_batch)[1])
    return Scored(light.labels, light_probs, heavy_probs, light_ms, heavy_ms, s.light.max_batch,
                  s.heavy.max_batch, torch.get_num_threads(), heavy.served_runtime)


# --------------------------------------------------------------------------- the controller replay
@dataclass
class Replay:
    """The controller replay: final thresholds, realised shares, what it did along the way."""

    budget: float
    rate: float
    interval_s: float
    records: int
    final: Thresholds
    stream_heavy: int  # messages the stream sent heavy under the thresholds of their time
    test_share: float  # heavy share of the whole test set under the final thresholds
    test_accuracy: float  # accuracy of the whole test set under the final thresholds
    last_window_share: float  # heavy share of the final statistics window
    decisions: int = 0
    changes: int = 0
    rollbacks: int = 0
    trajectory: list[tuple[float, int, float, str]] = field(default_factory=list)  # (t_s, length, escalate, action)

    @property
    def stream_share(self) -> float:
        return self.stream_heavy / self.records

    @property
    def ok(self) -> bool:
        return abs(self.test_share - self.budget) <= CONTROLLER_TOLERANCE


def replay_controller(confidence: FloatArray, lengths: npt.NDArray[np.int64], light_intents: Sequence[str],
                      heavy_intents: Sequence[str], labels: Sequence[str], budget: float = CONTROLLER_BUDGET,
                      rate: float = 40.0, seed: int = 7, light_ms: float = 1.0, heavy_ms: float = 20.0,
                      with_labels: bool = True, start: Thresholds | None = None) -> Replay:
    """Stream the messages (shuffled) through the feedback agent's statistics and controller, in process.

    Each message arrives `1 / rate` s after the previous one and is routed with the thresholds of the
    moment: longer than `length_threshold` -> heavy (rule), else light, and a light answer with
    confidence below `escalate_below` -> heavy (escalated). The result records the workers would
    produce feed `pipeline.core.stats.Aggregator`; every `interval_s` of stream time `pipeline.core.controller.decide`
    runs on its window and its changes are applied at once, as `pipeline.agents.feedback.Feedback.after_tick`
    does (Redis and Kafka left out; the window, controller and intervals are the agent's defaults).
    `start`: the thresholds to start from (default: the defaults with `heavy_budget=budget`).
    """
    cfg = FeedbackSection()
    agg = Aggregator(agg_config(cfg))
    ctl = controller_config(cfg, HeartbeatSection().startup_s)
    th = start if start is not None else Thresholds(heavy_budget=budget)
    state = ControllerState()
    n = len(confidence)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    step_ms = 1000.0 / rate
    t0 = 1_800_000_000_000
    next_tick = t0 + cfg.interval_s * 1000.0
    out = Replay(th.heavy_budget, rate, cfg.interval_s, n, th, 0, 0.0, 0.0, 0.0)
    out.trajectory.append((0.0, th.length_threshold, th.escalate_below, "start"))

    def record(i: int, tier: str, model: str, intent: str, conf: float, final: bool, escalated: bool,
               at: int, total: float) -> dict[str, Any]:
        return {"request_id": f"q{i}", "tier": tier, "stage": tier, "model": model, "intent": intent,
                "confidence": conf, "final": final, "shadow": False, "escalated": escalated, "degraded": False,
                "threshold_version": th.version, "answered_at": at, "batch_size": 1,
                "label": labels[i] if with_labels else None,
                "timings_ms": {"ingest": 0, "queue": 0, "inference": total, "total": total},
                "features": {"chars": int(lengths[i]), "vip": False}}

    def tick(now: int) -> None:
        nonlocal th, state
        agg.expire(now)
        w, recent = agg.window(now), agg.window(now, int(ctl.observe_s * 1000))
        d: Decision = decide(w, th, state, now / 1000.0, agg.after_change(), ctl, recent)
        out.decisions += 1
        if d.action == "hold":
            state = d.state
            if state.pending is None and agg.since is not None:
                agg.track_since(None)
            return
        th = th.changed("feedback", d.reason, d.inputs, **d.values)
        state = applied(d, th.version)
        agg.track_since(th.version if d.action == "change" else None)
        out.changes += d.action == "change"
        out.rollbacks += d.action == "rollback"
        out.trajectory.append(((now - t0) / 1000.0, th.length_threshold, th.escalate_below, d.action))

    for j, i in enumerate(order):
        now = int(t0 + j * step_ms)
        while now >= next_tick:
            tick(int(next_tick))
            next_tick += cfg.interval_s * 1000.0
        conf = float(confidence[i])
        if lengths[i] > th.length_threshold:
            out.stream_heavy += 1
            agg.add_result(record(i, "heavy", "heavy", heavy_intents[i], 1.0, True, False, now, heavy_ms), now)
        elif conf < th.escalate_below:
            out.stream_heavy += 1
            agg.add_result(record(i, "light", "light", light_intents[i], conf, False, False, now, light_ms), now)
            agg.add_result(record(i, "heavy", "heavy", heavy_intents[i], 1.0, True, True, now,
                                  light_ms + heavy_ms), now)
        else:
            agg.add_result(record(i, "light", "light", light_intents[i], conf, True, False, now, light_ms), now)
    end = int(t0 + n * step_ms)
    agg.expire(end)
    out.last_window_share = agg.window(end).heavy_share
    out.final = th
    heavy = (lengths > th.length_threshold) | (confidence < th.escalate_below)
    out.test_share = float(heavy.mean())
    answers = np.where(heavy, np.asarray(heavy_intents, dtype=object), np.asarray(light_intents, dtype=object))
    out.test_accuracy = float((answers == np.asarray(labels, dtype=object)).mean())
    return out


# --------------------------------------------------------------------------- the evaluation
@dataclass
class Evaluation:
    """Every curve and number of the benchmark."""

    n: int
    scored: Scored
    light_correct: FloatArray
    heavy_correct: FloatArray
    lengths: npt.NDArray[np.int64]
    curves: dict[str, FloatArray]  # router name -> k = 0..n accuracy curve
    length_curve: FloatArray
    length_points: tuple[FloatArray, FloatArray]  # (share, accuracy) at every length threshold
    length50: tuple[float, float]
    bootstrap: dict[str, tuple[float, float, float]]  # router -> APGR diff vs confidence, 95% CI
    best: str  # "confidence" unless another score is better beyond the bootstrap noise
    replay: Replay
    replay_no_length: Replay  # the same replay with length_threshold pinned at its maximum (rule off)
    held: HeldOut  # operating points chosen on a seeded half, measured on the other

    @property
    def acc_light(self) -> float:
        return float(self.light_correct.mean())

    @property
    def acc_heavy(self) -> float:
        return float(self.heavy_correct.mean())

    def apgr(self, router: str) -> float:
        return apgr(self.curves[router], self.acc_light, self.acc_heavy)

    def cpt(self, router: str, x: float) -> float | None:
        return cpt(self.curves[router], self.acc_light, self.acc_heavy, x)

    def at(self, router: str, shares: Sequence[float] | FloatArray) -> FloatArray:
        return at_shares(self.curves[router], shares)


def evaluate(texts: Sequence[str], intents: Sequence[str], scored: Scored, bootstrap_rounds: int,
             seed: int, budget: float, rate: float) -> Evaluation:
    index = {c: k for k, c in enumerate(scored.labels)}
    y = np.array([index[c] for c in intents])
    lp, hp = scored.light_probs, scored.heavy_probs
    light_correct = (lp.argmax(axis=1) == y).astype(np.float64)
    heavy_correct = (hp.argmax(axis=1) == y).astype(np.float64)
    lengths = np.array([routed_length(t) for t in texts], dtype=np.int64)  # what ingest routes on
    scores = router_scores(lp)
    curves = {name: cascade_curve(light_correct, heavy_correct, s) for name, s in scores.items()}
    length_curve = cascade_curve(light_correct, heavy_correct, -lengths.astype(np.float64))
    n = len(texts)
    thresholds = np.unique(np.concatenate([[0], lengths]))  # T -> messages longer than T go heavy
    shares = np.array([(lengths > t).mean() for t in thresholds])
    length_pts = (shares, at_shares(length_curve, shares))
    long50 = lengths > ARTICLE_LENGTH
    length50 = (float(long50.mean()), float(np.where(long50, heavy_correct, light_correct).mean()))
    boot = {name: bootstrap_apgr_diff(light_correct, heavy_correct, scores["confidence"], s, bootstrap_rounds, seed)
            for name, s in scores.items() if name != "confidence"}
    better = [name for name, (_, lo, _) in boot.items() if lo > 0]
    best = max(better, key=lambda k: boot[k][0]) if better else "confidence"
    labels = scored.labels
    args: dict[str, Any] = {
        "confidence": lp.max(axis=1), "lengths": lengths, "light_intents": [labels[k] for k in lp.argmax(axis=1)],
        "heavy_intents": [labels[k] for k in hp.argmax(axis=1)], "labels": list(intents), "budget": budget,
        "rate": rate, "seed": seed, "light_ms": scored.light_ms, "heavy_ms": scored.heavy_ms}
    replay = replay_controller(**args)
    rule_off = Thresholds(heavy_budget=budget, length_threshold=NO_LENGTH_RULE, pinned=("length_threshold",))
    replay_no_length = replay_controller(**args, start=rule_off)
    held = held_out(scores["confidence"], light_correct, heavy_correct, lengths, seed)
    return Evaluation(n, scored, light_correct, heavy_correct, lengths, curves, length_curve, length_pts,
                      length50, boot, best, replay, replay_no_length, held)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def checks(ev: Evaluation) -> list[Check]:
    """The issue's targets, each PASS or FAIL with the number behind it."""
    out = []
    h = ev.held
    b = h.best_within
    t = h.target
    reach = (f"; the smallest validation share reaching {TARGET_ACC:.1%} (escalate_below {t.threshold:.3f}) gives "
             f"{t.test_acc:.2%} at {t.test_share:.1%} heavy on the test half" if t is not None
             else f"; the validation half never reaches {TARGET_ACC:.1%}")
    out.append(Check(f"hybrid accuracy >= {TARGET_ACC:.1%} with <= {TARGET_SHARE:.0%} on heavy",
                     b.test_acc >= TARGET_ACC - 1e-12 and b.test_share <= TARGET_SHARE + 1e-12,
                     f"escalate_below {b.threshold:.3f} chosen on the validation half ({b.val_acc:.2%} at "
                     f"{b.val_share:.1%} heavy there): {b.test_acc:.2%} at {b.test_share:.1%} heavy on the test "
                     f"half{reach}"))
    c = h.cpt95
    out.append(Check(f"CPT(95%) <= {TARGET_CPT95:.0%}",
                     c is not None and c.test_share <= TARGET_CPT95 + 1e-12 and h.test_pgr(c) >= 0.95 - 1e-12,
                     "the validation half never recovers 95% of the gap" if c is None else
                     f"escalate_below {c.threshold:.3f} chosen on the validation half (PGR 95% at {c.val_share:.1%} "
                     f"heavy there): PGR {h.test_pgr(c):.1%} at {c.test_share:.1%} heavy on the test half"))
    inner = GRID[1:-1]
    mine = ev.at("confidence", inner)
    for name, base in (("random router", random_accuracy(ev.acc_light, ev.acc_heavy, inner)),
                       ("length-rule sweep", at_shares(ev.length_curve, inner))):
        margin = mine - base
        worst = int(np.argmin(margin))
        below = [f"{h:.0%}" for h, m in zip(inner, margin, strict=True) if m <= 0]
        out.append(Check(f"cascade above the {name} at every heavy share 1-99%", not below,
                         f"smallest margin {margin[worst] * 100:+.2f} points at {inner[worst]:.0%}"
                         + (f"; not above at {', '.join(below[:8])}{' ...' if len(below) > 8 else ''}"
                            if below else "")))
    r = ev.replay
    out.append(Check(f"controller with a {r.budget:.0%} budget lands within {CONTROLLER_TOLERANCE * 100:.0f} points",
                     r.ok, f"{r.test_share:.1%} of the test set heavy under its final thresholds "
                           f"(stream: {r.stream_share:.1%})"))
    return out


# --------------------------------------------------------------------------- plot
def plot(ev: Evaluation, path: Path) -> None:
    """Accuracy vs heavy share: full range and a zoom on 0-40%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 7.2), gridspec_kw={"width_ratios": [1, 1.25]})
    fine = np.arange(ev.n + 1) / ev.n
    shares, accs = ev.length_points
    r = ev.replay
    for ax, xmax in zip(axes, (100.0, 40.0), strict=True):
        ax.plot(fine * 100, ev.curves["confidence"] * 100, color="tab:blue", lw=2,
                label=f"cascade: light confidence < escalate_below (APGR {ev.apgr('confidence'):.3f})")
        if ev.best != "confidence":
            ax.plot(fine * 100, ev.curves[ev.best] * 100, color="tab:purple", lw=1.6,
                    label=f"cascade on {ev.best} (APGR {ev.apgr(ev.best):.3f})")
        ax.plot(GRID * 100, random_accuracy(ev.acc_light, ev.acc_heavy, GRID) * 100, color="0.45", ls=":", lw=1.8,
                label="random router, same share (expectation, APGR 0.500)")
        ax.plot(shares * 100, accs * 100, color="tab:green", ls="--", lw=1.5,
                label=f"length rule, threshold swept (APGR {apgr(ev.length_curve, ev.acc_light, ev.acc_heavy):.3f})")
        ax.plot([ev.length50[0] * 100], [ev.length50[1] * 100], "o", color="tab:green", ms=9, mec="k",
                label=f"length rule > {ARTICLE_LENGTH} chars (design article)")
        ax.plot([r.test_share * 100], [r.test_accuracy * 100], "D", color="tab:orange", ms=8, mec="k",
                label=f"controller, {r.budget:.0%} budget: final thresholds (length > {r.final.length_threshold}, "
                      f"conf < {r.final.escalate_below:.3f})")
        w = ev.replay_no_length
        ax.plot([w.test_share * 100], [w.test_accuracy * 100], "D", color="gold", ms=8, mec="k",
                label=f"controller, {w.budget:.0%} budget, length rule off: conf < {w.final.escalate_below:.3f}")
        ax.axhline(ev.acc_light * 100, color="tab:cyan", lw=1, label=f"light only {ev.acc_light:.2%}")
        ax.axhline(ev.acc_heavy * 100, color="tab:red", lw=1, label=f"heavy only {ev.acc_heavy:.2%}")
        ax.axhline(TARGET_ACC * 100, color="k", ls="-.", lw=1, label=f"target {TARGET_ACC:.1%}")
        ax.axvline(TARGET_SHARE * 100, color="k", ls=(0, (1, 3)), lw=1, label=f"{TARGET_SHARE:.0%} heavy share")
        ax.set_xlim(0, xmax)
        ax.set_xlabel("heavy share (% of messages answered by the heavy tier)")
        ax.set_ylabel("accuracy on BANKING77 test (%)")
        ax.grid(True, alpha=0.35)
    lo = min(ev.acc_light, float(accs.min())) * 100 - 0.3
    hi = max(float(ev.curves["confidence"].max()), ev.acc_heavy, TARGET_ACC) * 100 + 0.3
    for ax in axes:
        ax.set_ylim(lo, hi)
    axes[0].set_title("full range")
    axes[1].set_title("zoom: 0-40% heavy")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle(f"Light (char n-gram) / heavy (MiniLM + n-grams) routing on BANKING77, {ev.n:,} test messages")
    fig.tight_layout(rect=(0.0, 0.14, 1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- report
def _pct(x: float | None, nd: int = 1) -> str:
    return "never" if x is None else f"{x * 100:.{nd}f}%"


def report(ev: Evaluation, png: Path, quick: bool) -> str:
    """The BENCHMARKS.md section body (markdown)."""
    sc, r, w = ev.scored, ev.replay, ev.replay_no_length
    reserve = controller_config(FeedbackSection(), HeartbeatSection().startup_s).escalation_reserve
    al, ah = ev.acc_light, ev.acc_heavy
    sh = np.array(TABLE_SHARES)
    casc = ev.at("confidence", sh)
    rand = random_accuracy(al, ah, sh)
    length = at_shares(ev.length_curve, sh)
    cc = cascade_cost_ms(sh, sc.light_ms, sc.heavy_ms)
    oc = split_cost_ms(sh, sc.light_ms, sc.heavy_ms)
    try:
        rel = png.resolve().relative_to(ROOT)
    except ValueError:
        rel = png
    data = (f"a fixed random sample of {ev.n:,} of the 3,080 BANKING77 test messages (`--quick`)" if quick
            else f"all {ev.n:,} BANKING77 test messages (PolyAI, CC-BY-4.0)")
    lines = [
        f"Data: {data}. Models: the packaged artefacts, light = char n-gram linear model, heavy = MiniLM "
        f"(top layer tuned) fused with the n-gram model, both on the CPU (heavy encoder on {sc.heavy_runtime}; "
        f"{sc.torch_threads} threads). Load average while measuring: {os.getloadavg()[0]:.1f}.",
        "",
        f"Light only **{al:.2%}**, heavy only **{ah:.2%}** (gap {100 * (ah - al):.2f} points); "
        f"an oracle picking the right tier per message would get "
        f"{float(np.maximum(ev.light_correct, ev.heavy_correct).mean()):.2%}.",
        "",
        f"Measured batched CPU cost: light {sc.light_ms:.3f} ms/message (batches of {sc.light_batch}, median of 3), "
        f"heavy {sc.heavy_ms:.2f} ms/message (batches of {sc.heavy_batch}). Cost per 1,000 messages: the cascade "
        "pays light for every message plus heavy for the escalated ones; the random router and the length rule "
        "run one model per message.",
        "",
        "| heavy share | cascade acc | escalate_below | cascade CPU ms/1k | random acc | random CPU ms/1k "
        "| length rule acc (swept, interpolated) | length CPU ms/1k |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    conf = ev.scored.light_probs.max(axis=1)
    for h, c, ccost, ra, ln, ocost in zip(sh, casc, cc, rand, length, oc, strict=True):
        lines.append(f"| {h:.0%} | {c:.2%} | {threshold_for_share(conf, float(h)):.3f} | {ccost:,.0f} | {ra:.2%} | "
                     f"{ocost:,.0f} | {ln:.2%} | {ocost:,.0f} |")
    s50, a50 = ev.length50
    lines += [
        "",
        f"The design article's rule (> {ARTICLE_LENGTH} characters -> heavy) sends **{s50:.1%}** heavy for "
        f"**{a50:.2%}** at {float(split_cost_ms(s50, sc.light_ms, sc.heavy_ms)):,.0f} CPU ms/1k; the cascade at the "
        f"same share gives {float(at_shares(ev.curves['confidence'], [s50])[0]):.2%}. {_length_match(ev.held)}",
        "",
        "Routing metrics (PGR(h) = (acc(h) - light) / (heavy - light); APGR = area under PGR over heavy share "
        "0..1; CPT(x) = smallest heavy share with PGR >= x). Router scores use only the light model's output; "
        "ΔAPGR is against `confidence` with a 95% paired bootstrap interval "
        f"({'200' if quick else '1,000'} resamples):",
        "",
        "| router | APGR | CPT(50%) | CPT(80%) | CPT(95%) | acc @10% | @15% | @20% | @25% | ΔAPGR [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in ev.curves:
        a = ev.at(name, [0.10, 0.15, 0.20, 0.25])
        diff = "—" if name == "confidence" else "{:+.4f} [{:+.4f}, {:+.4f}]".format(*ev.bootstrap[name])
        tag = " (tierflow today)" if name == "confidence" else ""
        lines.append(f"| {name}{tag} | {ev.apgr(name):.3f} | {_pct(ev.cpt(name, 0.5))} | {_pct(ev.cpt(name, 0.8))} | "
                     f"{_pct(ev.cpt(name, 0.95))} | {a[0]:.2%} | {a[1]:.2%} | {a[2]:.2%} | {a[3]:.2%} | {diff} |")
    lc = ev.length_curve
    lines.append(f"| length rule (swept) | {apgr(lc, al, ah):.3f} | {_pct(cpt(lc, al, ah, 0.5))} | "
                 f"{_pct(cpt(lc, al, ah, 0.8))} | {_pct(cpt(lc, al, ah, 0.95))} | "
                 + " | ".join(f"{v:.2%}" for v in at_shares(lc, [0.10, 0.15, 0.20, 0.25])) + " | |")
    lines.append("| random router | 0.500 | 50.0% | 80.0% | 95.0% | "
                 + " | ".join(f"{v:.2%}" for v in random_accuracy(al, ah, [0.10, 0.15, 0.20, 0.25])) + " | |")
    if ev.best == "confidence":
        verdict = ("No light-only score beats plain confidence beyond the bootstrap noise: the worker's "
                   "`confidence < escalate_below` stays the router.")
    else:
        d, lo, hi = ev.bootstrap[ev.best]
        verdict = (f"**`{ev.best}` is a better router score than confidence** (ΔAPGR {d:+.4f}, 95% CI "
                   f"[{lo:+.4f}, {hi:+.4f}]): the worker should escalate on it.")
    lines += [
        "",
        verdict,
        "",
        *_held_out_lines(ev, quick),
        "",
        "Published anchor (a plain cascade: char TF-IDF + LR light, MiniLM + LR heavy) beside tierflow's:",
        "",
        "| | light | heavy | @10% | @20% | @25% | CPT(95%) | > 50 chars rule | random @25% |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
        f"| anchor | {ANCHOR['light']:.1%} | {ANCHOR['heavy']:.1%} | {ANCHOR[0.10]:.1%} | {ANCHOR[0.20]:.1%} | "
        f"{ANCHOR[0.25]:.1%} | ~{ANCHOR['cpt95']:.0%} | {ANCHOR['length50_share']:.1%} heavy, "
        f"{ANCHOR['length50_acc']:.1%} | {ANCHOR['random25']:.1%} |",
        f"| tierflow | {al:.1%} | {ah:.1%} | {ev.at('confidence', [0.10])[0]:.1%} | "
        f"{ev.at('confidence', [0.20])[0]:.1%} | {ev.at('confidence', [0.25])[0]:.1%} | "
        f"{_pct(ev.cpt('confidence', 0.95))} | {s50:.1%} heavy, {a50:.1%} | "
        f"{random_accuracy(al, ah, [0.25])[0]:.1%} |",
        "",
        "Targets:",
        "",
        "```",
        *[c.line() for c in checks(ev)],
        "```",
        "",
        f"Controller check (in process, not through Kafka or Redis): the {'sample' if quick else 'test set'} "
        f"replayed as one stream (shuffled, seed fixed) at {r.rate:.0f} messages/s of stream time, routed with the "
        "thresholds of the moment (longer than `length_threshold` -> heavy; else light, and a light confidence "
        "below `escalate_below` -> heavy). The result records the workers would write, with the real light "
        "confidences, lengths, intents and labels, feed `pipeline.core.stats.Aggregator`; every "
        f"{r.interval_s:.0f} s of stream time `pipeline.core.controller.decide` runs on its window (the feedback "
        "agent's default window, controller config and interval) and its changes apply at once, as the agent's "
        f"`after_tick` does. Start: the default thresholds (length 50, escalate_below 0.5), heavy_budget "
        f"{r.budget:.0%}. Latencies are the measured inference times, far under the SLOs.",
        "",
        f"- {r.decisions} decisions, {r.changes} changes, {r.rollbacks} rollbacks; thresholds "
        + " -> ".join(f"{t:.0f}s: ({ln}, {e:.3f})" for t, ln, e, _ in _thin(r.trajectory, 12))
        + " as (length_threshold, escalate_below)",
        f"- final thresholds: length_threshold {r.final.length_threshold}, escalate_below "
        f"{r.final.escalate_below:.4f}",
        f"- heavy share of the whole {'sample' if quick else 'test set'} under the final thresholds: "
        f"**{r.test_share:.1%}** (target {r.budget:.0%} ± {CONTROLLER_TOLERANCE * 100:.0f} points: "
        f"**{'PASS' if r.ok else 'FAIL'}**); accuracy {r.test_accuracy:.2%} (the confidence cascade alone at "
        f"that share: {ev.at('confidence', [r.test_share])[0]:.2%})",
        f"- heavy share over the stream as routed: {r.stream_share:.1%} (including the start at the defaults); "
        f"in the last statistics window: {r.last_window_share:.1%}",
        f"- the controller lets the length rule take up to {1 - reserve:.0%} of the budget (`escalation_reserve` "
        f"{reserve}), so long messages take most of it. "
        f"What-if, same replay with `length_threshold` pinned at {NO_LENGTH_RULE:,} (rule off, escalation only): "
        f"final escalate_below {w.final.escalate_below:.4f}, **{w.test_share:.1%}** heavy "
        f"({'within' if w.ok else 'outside'} ± {CONTROLLER_TOLERANCE * 100:.0f} points), accuracy "
        f"**{w.test_accuracy:.2%}** ({100 * (w.test_accuracy - r.test_accuracy):+.2f} points); "
        f"stream {w.stream_share:.1%}; {w.changes} changes, {w.rollbacks} rollbacks.",
        "",
        f"![accuracy vs heavy share]({rel})",
    ]
    return "\n".join(lines)


def compare(x: float, y: float) -> str:
    """Accuracy `x` against `y` (fractions) in words, as it holds: "0.12 points above", "... below", "equal to"."""
    d = (x - y) * 100.0
    if abs(d) < 0.005:
        return "equal to"
    return f"{abs(d):.2f} points {'above' if d > 0 else 'below'}"


def _length_match(h: HeldOut) -> str:
    m, (rs, ra) = h.length_match, h.length50_test
    if m is None:
        return (f"On the validation half no cut of the cascade reaches the rule's accuracy there "
                f"({h.length50_val[1]:.2%}).")
    return (f"Chosen on the validation half to reach the rule's accuracy there ({h.length50_val[1]:.2%}), the "
            f"cascade (escalate_below {m.threshold:.3f}) sends {m.test_share:.1%} heavy on the test half for "
            f"{m.test_acc:.2%}, where the rule sends {rs:.1%} for {ra:.2%}.")


def _held_out_lines(ev: Evaluation, quick: bool) -> list[str]:
    """The operating points, chosen on the validation half and measured on the test half, with the
    comparison to heavy-only that actually holds."""
    h = ev.held
    what = "sample" if quick else "test set"
    rows = [p for p in (h.best_within, h.target, h.cpt95, h.peak, h.length_match) if p is not None]
    curve = ev.curves["confidence"]
    top = int(np.argmax(curve))
    p = h.peak
    vs_heavy = compare(p.test_acc, h.test_heavy)
    why = (": the light model is right on some messages the heavy one gets wrong" if p.test_acc > h.test_heavy
           else "")
    return [
        f"Operating points are chosen on a seeded random half of the {what} (validation: {h.n_val:,} messages, "
        f"seed {h.seed}) and measured on the other half (test: {h.n_test:,}), never read off the curve they are "
        f"measured on. Light only / heavy only: validation {h.val_light:.2%} / {h.val_heavy:.2%}, test "
        f"{h.test_light:.2%} / {h.test_heavy:.2%}.",
        "",
        "| operating point (chosen on the validation half) | escalate_below | validation: heavy share | accuracy "
        "| test half: heavy share | accuracy | PGR |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {q.rule} | {q.threshold:.3f} | {q.val_share:.1%} | {q.val_acc:.2%} | {q.test_share:.1%} | "
          f"{q.test_acc:.2%} | {'—' if np.isnan(h.test_pgr(q)) else f'{h.test_pgr(q):.0%}'} |" for q in rows],
        "",
        f"The most accurate cut on the validation half gives {p.test_acc:.2%} on the test half at "
        f"{p.test_share:.1%} heavy: {vs_heavy} heavy-only there ({h.test_heavy:.2%}){why}. (The whole "
        f"{what}'s curve peaks at {curve[top]:.2%} at {top / ev.n:.1%} heavy, a maximum picked on the data it is "
        "measured on: a best case, not an operating point.)",
    ]


def _thin(points: list[tuple[float, int, float, str]], most: int) -> list[tuple[float, int, float, str]]:
    if len(points) <= most:
        return points
    keep = np.unique(np.linspace(0, len(points) - 1, most).round().astype(int))
    return [points[int(k)] for k in keep]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a fixed sample of 600 test messages")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--png", type=Path, default=None,
                    help=f"where the plot goes (default: {PNG.relative_to(ROOT)} with --write, else a temp file)")
    ap.add_argument("--seed", type=int, default=7, help="sample, bootstrap and replay-order seed")
    ap.add_argument("--budget", type=float, default=CONTROLLER_BUDGET, help="heavy budget of the controller check")
    ap.add_argument("--rate", type=float, default=40.0, help="messages per second of stream time in the replay")
    args = ap.parse_args(argv)

    texts, intents = load_test(600 if args.quick else None, args.seed)
    t0 = time.perf_counter()
    scored = score_models(texts, heavy_passes=1 if args.quick else 2)
    print(f"scored {len(texts)} messages in {time.perf_counter() - t0:.1f}s "
          f"(light {scored.light_ms:.3f} ms/msg, heavy {scored.heavy_ms:.2f} ms/msg)", flush=True)
    ev = evaluate(texts, intents, scored, 200 if args.quick else 1000, args.seed, args.budget, args.rate)
    # Only a run that writes BENCHMARKS.md replaces the committed plot beside it.
    png = args.png or (PNG if args.write else Path(tempfile.mkdtemp(prefix="tierflow-quality-")) / "quality.png")
    plot(ev, png)
    body = report(ev, png, args.quick)
    print(body)
    if args.write:
        write_section(TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The learning loop's decisions, apart from Kafka and Redis: which traffic becomes a training example, when a
candidate light model may replace the live one, and when a promoted one is rolled back.

- **Examples** (`ExampleStore`): a heavy answer at or above a confidence floor, or a label from
  `tierflow.labels`, on a request whose text was seen. One example per request id: a label replaces a heavy
  guess, a second heavy answer for the same id (a replay, a retry, a shadow after the escalation) is a duplicate.
  Guards against poisoning: at most `per_user` examples per user in the window and `per_minute` accepted a minute
  (a flood of one user's labels is capped, not learned); labels only with an intent the model knows.
  A fixed share of request ids (`holdout`, by a hash of the id) is never trained on: it is the evaluation slice.
- **Promotion** (`decide_promotion`): the candidate and the live model answer the same held-out examples; per
  example the difference of their correctness is -1, 0 or +1. Its mean, with a 95% normal-approximation interval
  (mean +- 1.96 sd / sqrt(n), sd the sample deviation of the differences: a paired test, so the two models'
  shared hard examples do not widen it), must be above a margin on agreement with heavy (the candidate is shown
  better), and, once enough labels are held out, the labelled interval must reach above its margin (the labels
  do not show it worse: a labelled slice is small, its interval wide, and requiring it to show a gain would
  refuse every candidate whose gain is smaller than the interval).
- **Cross-fitted evidence** (`crossfit_folds`): the held-out slice alone is small (20% of the traffic), and the
  last point of accuracy moves agreement with heavy by less than its interval. The examples the live model never
  saw (heavy's answers newer than its data window) are split into K folds by a hash of their text; the retraining
  also fits, with the candidate's recipe and L2, one model without each fold, which answers that fold. Those
  answers against the live model's, pooled with the candidate's own held-out pairs, are the agreement evidence:
  evidence about the retraining recipe on this data (each fold model saw (K-1)/K of the new examples, so it
  understates the candidate). The candidate's own held-out interval must then not show it worse.
- **Rollback** (`decide_rollback`): after a promotion the live model's escalation rate and its agreement with
  heavy (shadow pairs and labels) are watched; past a bound above (below) the parent's, with enough results,
  the parent goes back live.

Time is passed in (epoch ms); nothing here reads a clock.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from pipeline.core.routing import in_sample

Z95 = 1.96


class Source(StrEnum):
    HEAVY = "heavy"
    LABEL = "label"


class Verdict(StrEnum):
    """What became of one offered example."""

    ACCEPTED = "accepted"
    REPLACED = "replaced"  # a label took the place of the heavy guess for the same request
    DUPLICATE = "duplicate"  # the request already has an example at least as trusted
    BELOW_FLOOR = "below_floor"  # heavy was not sure enough
    UNKNOWN_INTENT = "unknown_intent"  # not one of the model's labels
    USER_CAP = "user_cap"  # this user already gave `per_user` examples in the window
    RATE_CAP = "rate_cap"  # `per_minute` examples were accepted this minute
    NO_TEXT = "no_text"  # the request's text was not seen (older than the text window, or an image only)
    OTHER_SCRIPT = "other_script"  # Chinese: answered by the multilingual model, not the one learned here


@dataclass(frozen=True, slots=True)
class Example:
    request_id: str
    text: str
    intent: str
    source: Source
    user: str
    at_ms: int
    held_out: bool  # in the evaluation slice: never trained on


@dataclass(frozen=True, slots=True)
class Guards:
    """What the store accepts. Defaults: `pipeline/settings.py` LearnSection."""

    heavy_floor: float = 0.8
    per_user: int = 50
    per_minute: int = 600
    holdout: float = 0.2
    window: int = 50_000
    window_ms: int = 7 * 24 * 3600 * 1000


@dataclass
class ExampleStore:
    """A bounded, windowed store of training and evaluation examples, one per request id."""

    labels: frozenset[str]
    guards: Guards = field(default_factory=Guards)
    examples: OrderedDict[str, Example] = field(default_factory=OrderedDict)  # oldest first
    per_user: Counter[str] = field(default_factory=Counter)
    counts: Counter[Verdict] = field(default_factory=Counter)
    _minute: int = -1
    _in_minute: int = 0
    new_training: int = 0  # training examples accepted since the last `take_training`
    n_held_out: int = 0  # of `examples`, kept as they change: the agent reports it every tick

    def offer(self, request_id: str, text: str | None, intent: str, source: Source, user: str, now_ms: int,
              confidence: float = 1.0, lang: str = "en") -> Verdict:
        """Offer one example; returns what became of it (counted in `counts`)."""
        verdict = self._judge(request_id, text, intent, source, user, now_ms, confidence, lang)
        self.counts[verdict] += 1
        if verdict in (Verdict.ACCEPTED, Verdict.REPLACED):
            assert text is not None
            old = self.examples.pop(request_id, None)
            if old is not None:
                self.per_user[old.user] -= 1
                self.n_held_out -= old.held_out
            ex = Example(request_id, text, intent, source, user, now_ms,
                         held_out=in_sample(request_id, self.guards.holdout))
            self.examples[request_id] = ex
            self.per_user[user] += 1
            self.n_held_out += ex.held_out
            if not ex.held_out:
                self.new_training += 1
            self._in_minute += 1
        self.expire(now_ms)
        return verdict

    def _judge(self, request_id: str, text: str | None, intent: str, source: Source, user: str, now_ms: int,
               confidence: float, lang: str) -> Verdict:
        if intent not in self.labels:
            return Verdict.UNKNOWN_INTENT
        if source is Source.HEAVY and confidence < self.guards.heavy_floor:
            return Verdict.BELOW_FLOOR
        old = self.examples.get(request_id)
        if old is not None and (old.source is Source.LABEL or source is Source.HEAVY):
            return Verdict.DUPLICATE
        if not text:
            return Verdict.NO_TEXT
        if lang == "zh":
            return Verdict.OTHER_SCRIPT
        if old is None and self.per_user[user] >= self.guards.per_user:
            return Verdict.USER_CAP
        minute = now_ms // 60_000
        if minute != self._minute:
            self._minute, self._in_minute = minute, 0
        if self._in_minute >= self.guards.per_minute:
            return Verdict.RATE_CAP
        return Verdict.REPLACED if old is not None else Verdict.ACCEPTED

    def expire(self, now_ms: int) -> None:
        """Drop the oldest examples past the window's size or age."""
        cutoff = now_ms - self.guards.window_ms
        while self.examples:
            rid, ex = next(iter(self.examples.items()))
            if len(self.examples) <= self.guards.window and ex.at_ms >= cutoff:
                break
            del self.examples[rid]
            self.n_held_out -= ex.held_out
            self.per_user[ex.user] -= 1
            if self.per_user[ex.user] <= 0:
                del self.per_user[ex.user]

    @property
    def n_training(self) -> int:
        return len(self.examples) - self.n_held_out

    def training(self) -> list[Example]:
        return [e for e in self.examples.values() if not e.held_out]

    def held_out(self, source: Source | None = None) -> list[Example]:
        return [e for e in self.examples.values() if e.held_out and (source is None or e.source is source)]

    def take_training(self) -> list[Example]:
        """The training examples, resetting the count of new ones (a retrain is starting)."""
        self.new_training = 0
        return self.training()


@dataclass(frozen=True, slots=True)
class Delta:
    """A paired difference of correctness (candidate - live) on n examples, with its 95% interval."""

    n: int
    candidate: float  # the candidate's accuracy on them
    live: float
    mean: float
    lo: float
    hi: float

    def as_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "candidate": round(self.candidate, 4), "live": round(self.live, 4),
                "delta": round(self.mean, 4), "lo": round(self.lo, 4), "hi": round(self.hi, 4)}


def paired_delta(candidate_right: Sequence[bool], live_right: Sequence[bool]) -> Delta:
    """Mean difference of per-example correctness and its 95% normal-approximation interval.

    With n < 2 the interval is unbounded (no evidence either way)."""
    n = len(candidate_right)
    if n != len(live_right):
        raise ValueError(f"paired_delta: {n} candidate outcomes against {len(live_right)} live ones")
    if n == 0:
        return Delta(0, 0.0, 0.0, 0.0, -math.inf, math.inf)
    d = [int(c) - int(lv) for c, lv in zip(candidate_right, live_right, strict=True)]
    mean = sum(d) / n
    if n < 2:
        return Delta(n, sum(candidate_right) / n, sum(live_right) / n, mean, -math.inf, math.inf)
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    half = Z95 * math.sqrt(var / n)
    return Delta(n, sum(candidate_right) / n, sum(live_right) / n, mean, mean - half, mean + half)


def fold_of(text: str, folds: int) -> int:
    """The cross-fitting fold of a text: by a hash of its normalised text, so a message sent twice (two request
    ids) is in one fold and no fold model is evaluated on a text it was trained on."""
    digest = hashlib.blake2b(" ".join(text.casefold().split()).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % folds


def crossfit_folds(examples: Sequence[Example], live_to_ms: int | None, folds: int) -> list[int | None]:
    """Per training example, its fold (None: not evaluated by cross-fitting). Only heavy's answers newer than the
    live model's data window (`live_to_ms`; None: it was trained on none of the store, as the packaged model) are:
    the live model never trained on them, so comparing it with a fold model there is fair. Labels are left out: one
    may have replaced a guess the live model trained on. With fewer than 2 folds, none."""
    if folds < 2:
        return [None] * len(examples)
    return [fold_of(e.text, folds)
            if e.source is Source.HEAVY and not e.held_out and (live_to_ms is None or e.at_ms > live_to_ms) else None
            for e in examples]


@dataclass(frozen=True, slots=True)
class RetrainPolicy:
    every: int = 500  # new training examples at least
    growth: float = 0.25  # ... and at least this share of what the last retraining used
    every_s: float = 600.0  # or, with any new, this long after the last one


def retrain_due(new: int, last_used: int, since_s: float, policy: RetrainPolicy) -> bool:
    """Whether to retrain, `new` training examples having arrived, `since_s` after the last retraining ended (which
    used `last_used`). A learning curve flattens: a few percent more data rarely moves a model past the promotion
    interval (measured on BANKING77: +8 examples gave the same model, +16% a worse L2 pick by noise), and each
    retraining costs CPU-minutes at a full window; so new data must grow the set by `growth` too. `every_s` with
    any new still retrains a full window whose oldest examples were replaced."""
    if new <= 0:
        return False
    return new >= max(policy.every, policy.growth * last_used) or since_s >= policy.every_s


@dataclass(frozen=True, slots=True)
class PromotionPolicy:
    margin: float = 0.0  # the agreement delta's lower bound must exceed this
    label_margin: float = 0.0  # the labelled delta's upper bound must reach this (the labels do not show it worse)
    min_eval: int = 100  # held-out heavy examples needed to decide at all
    min_labels: int = 30  # held-out labels before labelled accuracy is a criterion


@dataclass(frozen=True, slots=True)
class Decision:
    promote: bool
    why: str


def decide_promotion(agree: Delta, labelled: Delta, policy: PromotionPolicy,
                     pooled: Delta | None = None) -> Decision:
    """Promote only when the candidate beats the live model on agreement with heavy (interval above `margin`)
    and, with `min_labels` labels held out, the labels do not show it worse (interval reaching `label_margin`).

    `agree` is the candidate's own held-out delta. `pooled`, when the retraining cross-fitted, is that plus the fold
    models' deltas on the new examples: then `pooled` must be above the margin and `agree` must not be below it
    (the recipe is shown better, and the candidate itself not shown worse)."""
    if agree.n < policy.min_eval:
        return Decision(False, f"too little evidence: {agree.n} held-out heavy answers (needs {policy.min_eval})")
    crossfit = pooled if pooled is not None and pooled.n > agree.n else None
    if crossfit is not None:
        if crossfit.lo <= policy.margin:
            return Decision(False, f"agreement with heavy, cross-fitted: delta {crossfit.mean:+.1%}, 95% interval "
                                   f"[{crossfit.lo:+.1%}, {crossfit.hi:+.1%}] not above {policy.margin:+.1%} "
                                   f"(n={crossfit.n}: {agree.n} held out, {crossfit.n - agree.n} new by fold)")
        if agree.hi < policy.margin:
            return Decision(False, f"agreement with heavy {agree.candidate:.1%} vs live {agree.live:.1%} held out: "
                                   f"delta {agree.mean:+.1%}, 95% interval [{agree.lo:+.1%}, {agree.hi:+.1%}] below "
                                   f"{policy.margin:+.1%}: the candidate itself is shown worse (n={agree.n})")
    elif agree.lo <= policy.margin:
        return Decision(False, f"agreement with heavy {agree.candidate:.1%} vs live {agree.live:.1%}: delta "
                               f"{agree.mean:+.1%}, 95% interval [{agree.lo:+.1%}, {agree.hi:+.1%}] not above "
                               f"{policy.margin:+.1%} (n={agree.n})")
    if labelled.n >= policy.min_labels and labelled.hi < policy.label_margin:
        return Decision(False, f"labelled accuracy {labelled.candidate:.1%} vs live {labelled.live:.1%}: delta "
                               f"{labelled.mean:+.1%}, 95% interval [{labelled.lo:+.1%}, {labelled.hi:+.1%}] "
                               f"below {policy.label_margin:+.1%}: the labels show it worse (n={labelled.n})")
    labels = (f"; labelled {labelled.mean:+.1%} [{labelled.lo:+.1%}, {labelled.hi:+.1%}] (n={labelled.n})"
              if labelled.n >= policy.min_labels else f"; {labelled.n} labels held out (too few to judge)")
    fitted = ""
    if crossfit is not None:
        fitted = (f"; cross-fitted {crossfit.mean:+.1%} [{crossfit.lo:+.1%}, {crossfit.hi:+.1%}] "
                  f"(n={crossfit.n}: {crossfit.n - agree.n} new by fold)")
    return Decision(True, f"agreement with heavy {agree.candidate:.1%} vs live {agree.live:.1%}, delta "
                          f"{agree.mean:+.1%} [{agree.lo:+.1%}, {agree.hi:+.1%}] (n={agree.n})" + fitted + labels)


@dataclass(frozen=True, slots=True)
class RollbackPolicy:
    escalation_rise: float = 0.10  # absolute rise of the escalation rate over the parent's
    agreement_drop: float = 0.10  # absolute fall of agreement with heavy (shadow pairs and labels)
    min_results: int = 100  # light results of the promoted model before its escalation rate is judged
    min_pairs: int = 30  # agreement pairs before agreement is judged


@dataclass
class LiveRecord:
    """A model's recent light-tier outcomes: results (escalated or not) and agreement pairs, last N each."""

    size: int = 2000
    escalated: deque[bool] = field(default_factory=deque)
    agreed: deque[bool] = field(default_factory=deque)

    def result(self, escalated: bool) -> None:
        self.escalated.append(escalated)
        if len(self.escalated) > self.size:
            self.escalated.popleft()

    def pair(self, agreed: bool) -> None:
        self.agreed.append(agreed)
        if len(self.agreed) > self.size:
            self.agreed.popleft()

    @property
    def escalation_rate(self) -> float | None:
        return sum(self.escalated) / len(self.escalated) if self.escalated else None

    @property
    def agreement(self) -> float | None:
        return sum(self.agreed) / len(self.agreed) if self.agreed else None

    def summary(self) -> dict[str, float | int | None]:
        esc, agr = self.escalation_rate, self.agreement
        return {"results": len(self.escalated), "escalation_rate": None if esc is None else round(esc, 4),
                "pairs": len(self.agreed), "agreement": None if agr is None else round(agr, 4)}


def decide_rollback(live: LiveRecord, baseline: dict[str, float | int | None],
                    policy: RollbackPolicy) -> str | None:
    """Why the promoted model must go (None: it stays). `baseline`: the parent's `LiveRecord.summary()` at the
    promotion; a rate the parent never had is not judged."""
    esc, base_esc = live.escalation_rate, baseline.get("escalation_rate")
    if esc is not None and base_esc is not None and len(live.escalated) >= policy.min_results \
            and esc > float(base_esc) + policy.escalation_rise:
        return (f"escalation rate {esc:.1%} over {len(live.escalated)} results, parent's {float(base_esc):.1%}: "
                f"above the bound of +{policy.escalation_rise:.0%}")
    agr, base_agr = live.agreement, baseline.get("agreement")
    if agr is not None and base_agr is not None and len(live.agreed) >= policy.min_pairs \
            and agr < float(base_agr) - policy.agreement_drop:
        return (f"agreement with heavy {agr:.1%} over {len(live.agreed)} pairs, parent's {float(base_agr):.1%}: "
                f"below the bound of -{policy.agreement_drop:.0%}")
    return None


def correct(predicted: Iterable[str], truth: Iterable[str]) -> list[bool]:
    return [p == t for p, t in zip(predicted, truth, strict=True)]

"""Pure threshold control: window statistics + the Thresholds targets -> a decision (no I/O).

The controller moves two knobs, `length_threshold` (longer requests go heavy by rule) and
`escalate_below` (unsure light answers go heavy), so that the heavy tier answers `heavy_budget` of the
text traffic:

- Calibration (RouteLLM-style): the heavy share is predicted from the window's distributions, not
  from the lagging measured share: `share = (1 - degraded) * (R(T) + (1 - R(T)) * F(t))`, with R(T)
  the share a length threshold T routes heavy (VIPs always; non-VIPs longer than T, from the length
  distribution) and F(t) the share of light answers with confidence below t. `escalate_below` is
  set to the quantile of the light-confidence distribution that makes the prediction equal the
  target. When the rules alone leave escalation less than `escalation_reserve` of the budget,
  `length_threshold` rises to the length quantile that frees it.
- Hysteresis: nothing moves while the predicted share is within `deadband` of the target. A move must
  bring the predicted share closer to its target: with lumpy traffic (a few request lengths) a length
  step that would overshoot is not taken.
- Bounded steps: `escalate_below` moves at most `max_escalate_step`, `length_threshold` at most a
  factor `1 + max_length_step` per decision; never outside the Thresholds bounds; pinned keys stay.
- Latency: while the heavy tier's windowed p95 is over its SLO (and its workers do not already report
  it calm: the window remembers a slow spell for a whole window), traffic moves off heavy (length
  threshold up, escalation down) one `shed_step` of routed share per `shed_cooldown_s`, never more than
  a further step past that target. The thresholds from before the first shed are kept; once the heavy
  tier is healthy again, by ingest's own rule (`pipeline.core.health.calm`: workers' live p95 and lag under
  `recover_ratio` of their limits for `recover_after_s`), they are restored in one change. The restore
  waits for evidence (heavy answering in time, typically ingest's own probe) unless the shed left heavy
  nothing to answer; it is watched like any change (and nothing else moves meanwhile) and rolled back if
  the tier breaks again, after which no more-heavy move is made for `hold_after_rollback_s` (no
  flapping). No more-heavy calibration either while the window holds answers that ingest degraded (the
  heavy tier was unhealthy).
- Rollback: each change is observed on the answers routed under it (results carry the threshold
  version they were routed with). A change that moved traffic off heavy is rolled back when accuracy
  fell by more than `rollback_accuracy_drop` beyond what it was expected to cost (moved share x the
  heavy-light accuracy gap) and by more than two standard errors; the baseline is the last
  `observe_s` before the change, so drifting traffic is not mistaken for a bad change. A change that
  moved traffic onto heavy is rolled back when the heavy p95 broke the SLO by more than
  `rollback_slo_margin`. For `hold_after_rollback_s` the controller then makes no move in that
  direction again.
- Hand-overs (issue 20): `handover_budget` is a ceiling on the share of final answers handed over to a person,
  not a quota. The share at a `handover_above` is predicted from the window's out-of-scope scores of final
  answers (those over it are handed over; unlike the measured share it does not lag a change). Over budget,
  `handover_above` rises toward the score quantile that predicts the budget, at most `max_handover_step` a
  decision; the value it started from (an operator's or the default) is kept as its base. Under budget again
  it comes back down toward that base, never below it, and never so far that the prediction breaks the budget.
  A value someone else wrote meanwhile (`tierflow thresholds set` or `rollback`) becomes the new base. The move
  rides along the decision of the heavy-share stages (apart from a rollback, which is alone), and is not part of
  the watched `Change`: a hand-over threshold moves no traffic between the tiers, and a heavy rollback leaves it
  alone.

`score()` is the design article's per-model score, used to rank the models of a tier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt

from pipeline.core.health import HealthLimits, Observation, breach, calm, heavy_limits
from pipeline.core.stats import AfterChange, Distribution, TierWindow, WindowStats
from pipeline.core.thresholds import Thresholds

KNOBS = ("length_threshold", "escalate_below")
HANDOVER_KNOB = "handover_above"
TUNED = (*KNOBS, HANDOVER_KNOB)  # every key the controller moves
Direction = Literal["less_heavy", "more_heavy", "none"]
Action = Literal["hold", "change", "rollback"]


# --------------------------------------------------------------------------- the design article's score
def score(latency_ms: float, max_latency_ms: float, accuracy: float, alpha: float = 0.5) -> float:
    """`alpha * (1 - latency / max_latency) + (1 - alpha) * accuracy`, clamped to [0, 1].

    `latency_ms`: the model's mean latency over its last N results; `max_latency_ms`: the latency that
    earns no latency credit (the tier's SLO); `accuracy` in [0, 1]; `alpha` in [0, 1] weighs speed.
    """
    if max_latency_ms <= 0:
        raise ValueError("max_latency_ms must be positive")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must be in [0, 1]")
    s = alpha * (1.0 - latency_ms / max_latency_ms) + (1.0 - alpha) * accuracy
    return min(1.0, max(0.0, s))


def score_of(latencies: Iterable[float], outcomes: Iterable[int], max_latency_ms: float, alpha: float = 0.5,
             min_outcomes: int = 1) -> float | None:
    """The score over a model's last N results: mean latency and the share of correct outcomes (1/0).

    None while fewer than `min_outcomes` outcomes are known (accuracy unknown: no basis to rank).
    """
    lat = list(latencies)
    out = list(outcomes)
    if not lat or len(out) < max(1, min_outcomes):
        return None
    return score(sum(lat) / len(lat), max_latency_ms, sum(out) / len(out), alpha)


def rank_models(scores: Mapping[str, float | None]) -> list[str]:
    """Model names best first; models without a score last (in name order)."""
    known = sorted((k for k, v in scores.items() if v is not None), key=lambda k: (-(scores[k] or 0.0), k))
    return known + sorted(k for k, v in scores.items() if v is None)


# --------------------------------------------------------------------------- state and decisions
@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Tuning of the controller. Shares are fractions of text answers; times are seconds."""

    min_results: int = 200  # text answers in the window before acting
    min_confidence: int = 100  # light confidences in the window before calibrating escalate_below
    min_tier_results: int = 20  # answers of a tier before its p95 is trusted
    deadband: float = 0.01
    escalation_reserve: float = 0.2  # share of the budget kept for escalation when rules take the rest
    max_escalate_step: float = 0.05
    min_escalate_delta: float = 0.005
    max_length_step: float = 0.25  # relative
    min_length_delta: int = 2
    slo_tolerance: float = 0.0  # heavy p95 > slo * (1 + tolerance): shed (recovery: the Thresholds' health knobs)
    shed_step: float = 0.05
    shed_cooldown_s: float = 30.0  # at least a window, so the last shed shows in the p95
    observe_s: float = 60.0  # how long a change is watched for a rollback
    min_check_labeled: int = 50
    min_check_heavy: int = 20
    rollback_accuracy_drop: float = 0.05
    rollback_z: float = 2.0  # a drop must also exceed this many standard errors of the difference
    rollback_slo_margin: float = 0.2  # heavy p95 > slo * (1 + margin) after a more-heavy change
    hold_after_rollback_s: float = 60.0
    startup_s: float = 300.0  # a heavy worker starting this long still stands for a ready one (core/health.py)
    min_oos_scores: int = 200  # final answers' out-of-scope scores in the window before moving handover_above
    max_handover_step: float = 0.05
    min_handover_delta: float = 0.005


@dataclass(frozen=True, slots=True)
class Change:
    """A change the controller made, under observation until accepted or rolled back."""

    version: int  # the version it wrote (0 until written)
    previous_version: int
    at_s: float
    values_before: Mapping[str, float]
    values_after: Mapping[str, float]
    direction: Direction
    shed: bool
    baseline_accuracy: float | None
    baseline_heavy_p95_ms: float | None
    expected_accuracy_cost: float = 0.0  # accuracy the change was expected to give up (less heavy)
    baseline_labeled: int = 0
    restore: bool = False  # puts back the thresholds from before a shed


@dataclass(frozen=True, slots=True)
class ControllerState:
    """What the controller remembers between decisions (persisted by the agent)."""

    pending: Change | None = None
    shed_target: float | None = None  # routed heavy share aimed at while shedding for the SLO
    shed_at_s: float = 0.0
    home: Mapping[str, float] | None = None  # the knobs before the first shed, until a restore of them holds
    home_version: int = 0  # the version `home` was read from
    calm_since: float | None = None  # since when the heavy tier has looked healthy, without a break
    hold_until_s: float = 0.0  # after a rollback, no move in the `blocked` direction until then
    blocked: Direction | None = None
    # While the controller holds handover_above raised over budget: the value it started from (never gone below)
    # and the value it wrote last (a different one in the document was written by someone else: the new base).
    handover_base: float | None = None
    handover_set: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ControllerState:
        p = d.get("pending")
        pending = Change(**{**p, "values_before": dict(p["values_before"]),
                            "values_after": dict(p["values_after"])}) if p else None
        home = d.get("home")
        if home is None and d.get("length_home") is not None:  # a snapshot from before restores existed
            home = {"length_threshold": d["length_home"]}
        return cls(pending=pending, shed_target=d.get("shed_target"), shed_at_s=float(d.get("shed_at_s", 0.0)),
                   home=dict(home) if home is not None else None, home_version=int(d.get("home_version", 0)),
                   calm_since=d.get("calm_since"), hold_until_s=float(d.get("hold_until_s", 0.0)),
                   blocked=d.get("blocked"), handover_base=d.get("handover_base"),
                   handover_set=d.get("handover_set"))


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now. `state` is the state to keep once the decision is carried out."""

    action: Action
    reason: str
    inputs: dict[str, Any]
    state: ControllerState
    values: dict[str, float | int] = field(default_factory=dict)
    rollback_to: int | None = None
    change: Change | None = None  # for action == "change": what to observe once written


def applied(decision: Decision, version: int) -> ControllerState:
    """The state after `decision` was written as threshold `version`."""
    if decision.action == "change" and decision.change is not None:
        return replace(decision.state, pending=replace(decision.change, version=version))
    return decision.state


# --------------------------------------------------------------------------- bounds
def _bounds(key: str) -> tuple[float, float]:
    lo, hi = -math.inf, math.inf
    for m in Thresholds.model_fields[key].metadata:
        if isinstance(m, Ge):
            lo = float(m.ge)  # type: ignore[arg-type]
        elif isinstance(m, Gt):
            lo = float(m.gt) + (1 if key == "length_threshold" else 1e-9)  # type: ignore[arg-type]
        elif isinstance(m, Le):
            hi = float(m.le)  # type: ignore[arg-type]
        elif isinstance(m, Lt):
            hi = float(m.lt) - (1 if key == "length_threshold" else 1e-9)  # type: ignore[arg-type]
    return lo, hi


BOUNDS: dict[str, tuple[float, float]] = {k: _bounds(k) for k in TUNED}


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


# --------------------------------------------------------------------------- the share model
def rule_share(w: WindowStats, length_threshold: float) -> float:
    """Share of text requests the rules send heavy at `length_threshold` (VIPs + longer ones)."""
    nonvip = 1.0 - w.vip_share
    if w.chars.count == 0:
        return w.rule_heavy_share
    return w.vip_share + nonvip * (1.0 - w.chars.cdf(length_threshold + 0.5))


def routed_share(w: WindowStats, length_threshold: float, escalate_below: float) -> float:
    """Share of text requests the thresholds route to heavy (by rule or escalation) on this window's traffic."""
    r = rule_share(w, length_threshold)
    return r + (1.0 - r) * w.confidence.cdf(escalate_below)


def predicted_share(w: WindowStats, length_threshold: float, escalate_below: float) -> float:
    """Heavy share of text answers the thresholds would give on this window's traffic (less what is degraded)."""
    return (1.0 - w.degraded_share) * routed_share(w, length_threshold, escalate_below)


def calibrate_escalation(confidence: Distribution, target: float, rule: float) -> tuple[float, float]:
    """(escalate_below, q): the confidence quantile q that tops the rule share `rule` up to `target`."""
    q = _clamp((target - rule) / (1.0 - rule), 0.0, 1.0) if rule < 1.0 else 0.0
    if q <= 0.0:
        return 0.0, 0.0
    if q >= 1.0:
        return 1.0, 1.0
    t = confidence.quantile(q)
    return (0.0 if t is None else t), q


def calibrate_length(w: WindowStats, rule_target: float) -> float | None:
    """The length threshold at which the rules route `rule_target` of text traffic heavy (None: unknown)."""
    nonvip = 1.0 - w.vip_share
    if w.chars.count == 0 or nonvip <= 0.0:
        return None
    over = (rule_target - w.vip_share) / nonvip  # share of non-VIP requests to be longer than T
    if over <= 0.0:
        return math.inf
    return w.chars.quantile(1.0 - min(1.0, over))


def handover_share(oos: Distribution, handover_above: float) -> float:
    """Share of final answers handed over at `handover_above`: those whose out-of-scope score is over it."""
    if oos.count == 0 or handover_above >= 1.0:  # no score is over 1
        return 0.0
    return 1.0 - oos.cdf(handover_above)


def calibrate_handover(oos: Distribution, budget: float) -> float:
    """The `handover_above` at which a share `budget` of final answers is handed over: the (1 - budget) score
    quantile (1: never, when the scores are unknown or the budget is 0)."""
    if budget <= 0.0:
        return 1.0
    t = oos.quantile(1.0 - min(1.0, budget))
    return 1.0 if t is None else t


def _diff_se(p1: float, n1: int, p2: float, n2: int) -> float:
    """Standard error of the difference of two proportions (n1 == 0: of the second alone)."""
    var = p2 * (1.0 - p2) / max(1, n2)
    if n1 > 0:
        var += p1 * (1.0 - p1) / n1
    return math.sqrt(var)


def _direction(before: float, after: float, eps: float = 1e-4) -> Direction:
    if after < before - eps:
        return "less_heavy"
    if after > before + eps:
        return "more_heavy"
    return "none"


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def _inputs(w: WindowStats, th: Thresholds, now_s: float) -> dict[str, Any]:
    tiers = {}
    for name, t in w.tiers.items():
        tiers[name] = {"answers": t.finals, "p95_ms": _r(t.p95_ms, 1), "accuracy": _r(t.accuracy),
                       "labeled": t.labeled, "agreement": _r(t.agreement), "agreed": t.agreed,
                       "escalation_rate": _r(t.escalation_rate), "degradation_rate": _r(t.degradation_rate),
                       "abstained": t.abstained, "handovers": t.handovers}
    return {
        "at": round(now_s, 3),
        "text_answers": w.text_finals,
        "heavy_share": _r(w.heavy_share),
        "rule_heavy_share": _r(w.rule_heavy_share),
        "escalated_share": _r(w.escalated_share),
        "degraded_share": _r(w.degraded_share),
        "heavy_budget": th.heavy_budget,
        "accuracy": _r(w.accuracy),
        "labeled": w.labeled,
        "min_accuracy": th.min_accuracy,
        "heavy_slo_p95_ms": th.heavy_slo_p95_ms,
        "light_slo_p95_ms": th.light_slo_p95_ms,
        "answers": w.finals,
        "handovers": w.handovers,
        "handover_share": _r(w.handover_share),
        "handover_budget": th.handover_budget,
        "tiers": tiers,
    }


# --------------------------------------------------------------------------- the heavy tier now

def _heavy_now(now: Observation | None, window_p95: float | None, lim: HealthLimits) -> tuple[bool, bool, str]:
    """(calm, answering, what was seen) for the heavy tier at this moment.

    From its workers' heartbeats when given (ingest's signal: live p95 over the last seconds, lag), else
    from the window's p95, which remembers a slow spell for a whole window. `answering` is evidence: answers
    of the last seconds. An idle tier looks calm only for want of bad news.
    """
    if now is not None:
        return calm(now, lim), now.p95_ms > 0.0, f"heavy workers' p95 {now.p95_ms:.0f} ms, lag {now.lag}"
    if window_p95 is None:
        return True, False, "no heavy answers in the window"
    return window_p95 <= lim.slo_p95_ms * lim.recover_ratio, True, f"heavy p95 {window_p95:.0f} ms in the window"


# --------------------------------------------------------------------------- the decision
def _judge(p: Change, after: AfterChange | None, th: Thresholds, now_s: float, cfg: ControllerConfig,
           heavy_now: Observation | None) -> tuple[str, str]:
    """('rollback' | 'accept' | 'observe', why) for the change under observation."""
    age = now_s - p.at_s
    broke = breach(heavy_now, heavy_limits(th, cfg.startup_s)) if p.restore and heavy_now is not None else None
    if broke is not None and heavy_now is not None:
        return "rollback", (f"the heavy tier broke again ({broke}: workers' p95 {heavy_now.p95_ms:.0f} ms, "
                            f"lag {heavy_now.lag}, {heavy_now.workers} workers)")
    if after is not None and after.version == p.version:
        if p.direction == "less_heavy" and not p.shed and after.accuracy is not None \
                and after.labeled >= cfg.min_check_labeled and p.baseline_accuracy is not None:
            drop = p.baseline_accuracy - after.accuracy
            allowed = cfg.rollback_accuracy_drop + p.expected_accuracy_cost
            noise = cfg.rollback_z * _diff_se(p.baseline_accuracy, p.baseline_labeled, after.accuracy, after.labeled)
            if drop > allowed + noise:
                return "rollback", (f"accuracy fell {p.baseline_accuracy:.3f} -> {after.accuracy:.3f}, more than "
                                    f"{allowed:.3f} (bound {cfg.rollback_accuracy_drop:.3f} + expected "
                                    f"{p.expected_accuracy_cost:.3f}) + noise {noise:.3f} on {after.labeled} "
                                    "labeled answers")
        limit = th.heavy_slo_p95_ms * (1.0 + cfg.rollback_slo_margin)
        if (p.direction == "more_heavy" or p.restore) and after.heavy_p95_ms is not None \
                and after.heavy >= cfg.min_check_heavy and after.heavy_p95_ms > limit \
                and (p.baseline_heavy_p95_ms is None or p.baseline_heavy_p95_ms <= limit):
            return "rollback", (f"heavy p95 {after.heavy_p95_ms:.0f} ms broke the SLO "
                                f"{th.heavy_slo_p95_ms:.0f} ms by more than {cfg.rollback_slo_margin:.0%}")
    if age >= cfg.observe_s:
        return "accept", f"v{p.version} held for {age:.0f}s"
    return "observe", ""


@dataclass
class _Tick:
    """One decision's inputs and what the stages have found so far (notes, the state as it evolves)."""

    w: WindowStats
    th: Thresholds
    state: ControllerState
    now_s: float
    cfg: ControllerConfig
    heavy_now: Observation | None
    inputs: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    calm_now: bool = False  # stage 2's reading of the heavy tier now, which stage 3 reuses
    seen: str = ""

    @property
    def heavy(self) -> TierWindow | None:
        return self.w.tier("heavy")

    @property
    def light(self) -> TierWindow | None:
        return self.w.tier("light")

    @property
    def p95(self) -> float | None:
        """The heavy tier's p95 in the window, when it rests on enough answers."""
        h = self.heavy
        return h.p95_ms if h is not None and h.finals >= self.cfg.min_tier_results else None

    def hold(self, why: str) -> Decision:
        return Decision("hold", why, self.inputs, self.state)


@dataclass(frozen=True, slots=True)
class _Goal:
    """What the calibration aims at: the routed heavy share `goal`, the answered share `target`."""

    shed: bool
    goal: float
    target: float


def decide(w: WindowStats, th: Thresholds, state: ControllerState, now_s: float,
           after: AfterChange | None = None, cfg: ControllerConfig | None = None,
           recent: WindowStats | None = None, heavy_now: Observation | None = None) -> Decision:
    """The controller's move for this window. Pure: the caller writes `values` and keeps `state`.

    `after`: the answers routed under the change being observed. `recent`: the last `observe_s` of the
    window, the accuracy baseline of a new change (the whole window lags behind drifting traffic).
    `heavy_now`: what the heavy workers' heartbeats say now (the agent reads them), the signal recovery is
    judged on; without it the window's p95 stands in, and recovery waits for the slow spell to leave it.

    Four stages, each may end the decision: (1) the change under watch is kept, accepted or rolled back;
    (2) a heavy tier healthy again gets its thresholds from before the shed back; (3) a breached SLO sets a
    shed goal; (4) the knobs move toward the goal (the budget, or the shed's). Unless (1) rolled back, the
    hand-over budget's move of `handover_above` joins the decision (a hold with it becomes a change).
    """
    cfg = cfg or ControllerConfig()
    t = _Tick(w, th, state, now_s, cfg, heavy_now, _inputs(w, th, now_s))
    t.inputs["heavy_p95_ms"] = _r(t.p95, 1)
    if heavy_now is not None:
        t.inputs["heavy_workers"] = {"workers": heavy_now.workers, "lag": heavy_now.lag,
                                     "p95_ms": round(heavy_now.p95_ms, 1)}
    rollback = _watch(t, after)
    if rollback is not None:
        return rollback  # alone: the hand-over budget is looked at again on the next tick
    d = _recover(t, recent) or _enough_traffic(t) or _calibrate(t, _slo_goal(t), recent)
    return _with_handover(d, _handover(t, d.state))


def _watch(t: _Tick, after: AfterChange | None) -> Decision | None:
    """1. The change under observation: keep, accept or roll back."""
    state, th, now_s = t.state, t.th, t.now_s
    if state.pending is None:
        return None
    verdict, why = _judge(state.pending, after, th, now_s, t.cfg, t.heavy_now)
    p = state.pending
    if verdict == "rollback":
        pinned = set(th.pinned)
        restore: dict[str, float | int] = {k: int(v) if k == "length_threshold" else float(v)
                                           for k, v in p.values_before.items() if k not in pinned}
        t.inputs.update(rolled_back=p.version, rollback_to=p.previous_version,
                        after_change=asdict(after) if after else None)
        what = "the restore " if p.restore else ""
        reason = f"rollback {what}v{p.version} to v{p.previous_version}: {why}"
        # a failed restore keeps `home`: the next recovery restores it again, after the hold
        new_state = replace(state, pending=None, hold_until_s=now_s + t.cfg.hold_after_rollback_s,
                            blocked="more_heavy" if p.restore else p.direction, calm_since=None)
        return Decision("rollback", reason, t.inputs, new_state, restore, rollback_to=p.previous_version)
    if verdict == "accept":
        t.state = replace(state, pending=None, home=None if p.restore else state.home)
    return None


def _recover(t: _Tick, recent: WindowStats | None) -> Decision | None:
    """2. The heavy tier healthy again: the thresholds from before the shed come back in one change."""
    th, now_s, w = t.th, t.now_s, t.w
    lim = heavy_limits(th, t.cfg.startup_s)
    calm_now, answering, seen = _heavy_now(t.heavy_now, t.p95, lim)
    t.calm_now, t.seen = calm_now, seen
    state = t.state
    since = (now_s if state.calm_since is None else state.calm_since) if calm_now else None
    state = replace(state, calm_since=since)
    if state.blocked is not None and now_s >= state.hold_until_s:
        state = replace(state, blocked=None)
    t.state = state
    if state.pending is not None and state.pending.restore:
        return t.hold(f"the restore v{state.pending.version} is under watch ({seen})")
    pinned = set(th.pinned)
    calm_for = now_s - state.calm_since if state.calm_since is not None else -1.0
    if state.home is None or calm_for < th.recover_after_s:
        return None
    back: dict[str, float | int] = {k: int(v) if k == "length_threshold" else float(v)
                                    for k, v in state.home.items() if k not in pinned and getattr(th, k) != v}
    if not back:
        t.state = replace(state, home=None, shed_target=None)
    elif not answering and routed_share(w, th.length_threshold, th.escalate_below) > t.cfg.deadband:
        # heavy is idle because ingest degraded its traffic: ingest's probe will bring evidence
        t.notes.append(f"heavy tier calm but idle ({seen}): restoring v{state.home_version} once it answers")
    elif state.blocked == "more_heavy":
        return t.hold(f"heavy tier healthy again ({seen}), but a more-heavy move was rolled back: "
                      f"v{state.home_version} restored in {state.hold_until_s - now_s:.0f}s at the earliest")
    else:
        return _restore(w, th, replace(state, shed_target=None), now_s, back, t.inputs, t.notes,
                        f"{seen}; under {th.recover_ratio:.0%} of its limits for {calm_for:.1f}s",
                        t.heavy_now.p95_ms if t.heavy_now is not None else t.p95, recent, t.cfg)
    return None


def _enough_traffic(t: _Tick) -> Decision | None:
    """No move on too little evidence, nor while every heavy-bound request is degraded anyway."""
    if t.w.text_finals < t.cfg.min_results:
        return t.hold(_join(t.notes, f"{t.w.text_finals} text answers in the window (< {t.cfg.min_results})"))
    if t.w.degraded_share >= 1.0:
        return t.hold("all heavy-bound traffic is degraded to light")
    return None


def _slo_goal(t: _Tick) -> _Goal:
    """3. The heavy SLO: shed traffic off heavy while it is breached; else aim at the budget."""
    th, w, cfg, state, now_s = t.th, t.w, t.cfg, t.state, t.now_s
    slo = th.heavy_slo_p95_ms
    p95, heavy_now = t.p95, t.heavy_now
    calm_now, seen = t.calm_now, t.seen
    shed = False
    # The window's p95, or the workers' now (their batch in hand included): a slowdown is seen from the
    # first batch that overruns the SLO, not only once its late answers have filled 5% of the window.
    worst = max((x for x in (p95, heavy_now.p95_ms if heavy_now is not None else None) if x is not None),
                default=None)
    if worst is not None and worst > slo * (1.0 + cfg.slo_tolerance):
        if calm_now:
            t.notes.append(f"heavy p95 {worst:.0f} ms > SLO {slo:.0f} ms in the window, but {seen} now: "
                           "no more shedding")
        elif state.shed_target is None or now_s - state.shed_at_s >= cfg.shed_cooldown_s:
            routed = routed_share(w, th.length_threshold, th.escalate_below)
            base = routed if state.shed_target is None else min(state.shed_target, routed)
            goal_shed = max(0.0, base - cfg.shed_step)
            first = state.home is None
            t.state = replace(state, shed_target=round(goal_shed, 4), shed_at_s=now_s,
                              home={k: getattr(th, k) for k in KNOBS} if first else state.home,
                              home_version=th.version if first else state.home_version)
            shed = True
            t.notes.append(f"heavy p95 {worst:.0f} ms > SLO {slo:.0f} ms ({seen}): shedding heavy traffic to "
                           f"{goal_shed:.3f} of text routed heavy")
    degraded = w.degraded_share
    if t.state.shed_target is not None:
        goal = t.state.shed_target  # routed share; what heavy answers of it is less by the degraded share
        target = goal * (1.0 - degraded)
    else:
        target = th.heavy_budget
        goal = min(1.0, target / (1.0 - degraded))  # for the traffic the degraded share leaves controllable
    t.inputs["target_share"] = round(target, 4)
    light = t.light
    if light is not None and light.p95_ms is not None and light.finals >= cfg.min_tier_results \
            and light.p95_ms > th.light_slo_p95_ms:
        t.notes.append(f"light p95 {light.p95_ms:.0f} ms > SLO {th.light_slo_p95_ms:.0f} ms (add light workers)")
    if w.accuracy is not None and w.labeled >= cfg.min_check_labeled and w.accuracy < th.min_accuracy:
        t.notes.append(f"accuracy {w.accuracy:.3f} < min_accuracy {th.min_accuracy:.3f}")
    return _Goal(shed, goal, target)


def _calibrate(t: _Tick, g: _Goal, recent: WindowStats | None) -> Decision:
    """4. Move the knobs toward the goal in bounded steps: `length_threshold` first, then `escalate_below`."""
    w, th, cfg, state, now_s, inputs, notes = t.w, t.th, t.cfg, t.state, t.now_s, t.inputs, t.notes
    shed, goal, target, degraded = g.shed, g.goal, g.target, w.degraded_share
    heavy, light, p95 = t.heavy, t.light, t.p95
    pinned = set(th.pinned)
    cur_len, cur_esc = th.length_threshold, th.escalate_below
    before = predicted_share(w, cur_len, cur_esc)
    inputs["predicted_share"] = round(before, 4)
    band = cfg.deadband
    if abs(before - target) <= band and not shed:
        return t.hold(_join(notes, f"predicted heavy share {before:.3f} within {band:.3f} of target {target:.3f}"))

    lo_len, hi_len = BOUNDS["length_threshold"]
    new_len = float(cur_len)
    if "length_threshold" not in pinned:
        reserve = cfg.escalation_reserve * goal
        wanted: float | None = None
        if shed:
            wanted = cur_len * (1.0 + cfg.max_length_step)
        elif rule_share(w, cur_len) > goal - reserve:
            wanted = calibrate_length(w, goal - reserve)
        if wanted is not None:
            step = _clamp(wanted, cur_len / (1.0 + cfg.max_length_step), cur_len * (1.0 + cfg.max_length_step))
            new_len = _clamp(float(math.ceil(step) if step > cur_len else math.floor(step)), lo_len, hi_len)
            if abs(new_len - cur_len) < cfg.min_length_delta and not (shed and new_len != cur_len):
                new_len = float(cur_len)

    def escalation_for(length: float) -> tuple[float, float | None]:
        """escalate_below (bounded step) that tops the rules at `length` up to the goal, and its quantile."""
        if "escalate_below" in pinned or w.confidence.count < cfg.min_confidence:
            return cur_esc, None
        want_esc, q = calibrate_escalation(w.confidence, goal, rule_share(w, length))
        lo_esc, hi_esc = BOUNDS["escalate_below"]
        step_esc = _clamp(want_esc - cur_esc, -cfg.max_escalate_step, cfg.max_escalate_step)
        esc = _clamp(cur_esc + step_esc, lo_esc, hi_esc)
        if shed:
            esc = min(esc, cur_esc)  # shedding never escalates more
        if abs(esc - cur_esc) < cfg.min_escalate_delta:
            esc = cur_esc
        return round(esc, 4), q

    def closer(length: float, esc: float) -> bool:
        """Whether the move gets the predicted share nearer its target (a shed: off heavy, at most a step past)."""
        share = predicted_share(w, length, esc)
        if shed:
            return share < before - 1e-4 and share >= target - cfg.shed_step * (1.0 - degraded) - 1e-4
        return abs(share - target) < abs(before - target) - 1e-4

    new_esc, q = escalation_for(new_len)
    if new_len != cur_len and not closer(new_len, new_esc):
        # lumpy lengths: this step moves too much traffic at once; leave the length to a later window
        notes.append(f"length_threshold {cur_len} -> {int(new_len)} kept: it would move the predicted share "
                     f"to {predicted_share(w, new_len, new_esc):.3f}")
        new_len = float(cur_len)
        new_esc, q = escalation_for(new_len)
    if new_esc != cur_esc and not closer(new_len, new_esc):
        new_esc = cur_esc
    if "escalate_below" not in pinned and w.confidence.count < cfg.min_confidence:
        notes.append(f"{w.confidence.count} light confidences (< {cfg.min_confidence}): escalate_below kept")

    values: dict[str, float | int] = {}
    if int(new_len) != cur_len:
        values["length_threshold"] = int(new_len)
    if new_esc != cur_esc:
        values["escalate_below"] = new_esc
    if not values:
        return t.hold(_join(notes, f"predicted heavy share {before:.3f} vs target {target:.3f}: "
                                 "no allowed move (pinned, bounded, no data or none gets closer)"))
    after_share = predicted_share(w, new_len, new_esc)
    direction = _direction(before, after_share)
    if state.blocked is not None and direction == state.blocked and not shed:
        return t.hold(_join(notes, f"a {direction.replace('_', '-')} move was rolled back; not again for "
                                 f"{state.hold_until_s - now_s:.0f}s (predicted heavy share {before:.3f} vs "
                                 f"target {target:.3f})"))
    if direction == "more_heavy" and degraded > band:
        return t.hold(_join(notes, f"{degraded:.3f} of answers in the window were degraded (heavy unhealthy): "
                                 f"no move onto heavy (predicted heavy share {before:.3f} vs target {target:.3f})"))
    cost = 0.0
    if direction == "less_heavy" and heavy is not None and light is not None \
            and heavy.accuracy is not None and light.accuracy is not None:
        cost = (before - after_share) * max(0.0, heavy.accuracy - light.accuracy)
    inputs.update(predicted_after=round(after_share, 4), confidence_quantile=_r(q),
                  rule_share_after=round(rule_share(w, new_len), 4))
    moves = _moves(th, values)
    what = "shed" if shed else "calibrate"
    reason = _join(notes, f"{what}: heavy share {w.heavy_share:.3f} (predicted {before:.3f}) vs target "
                          f"{target:.3f}: {moves} (predicted {after_share:.3f})")
    ref = recent if recent is not None and recent.labeled >= cfg.min_check_labeled else w
    change = Change(version=0, previous_version=th.version, at_s=now_s,
                    values_before={k: getattr(th, k) for k in values}, values_after=dict(values),
                    direction=direction, shed=shed, baseline_accuracy=ref.accuracy,
                    baseline_heavy_p95_ms=p95, expected_accuracy_cost=round(cost, 4),
                    baseline_labeled=ref.labeled)
    return Decision("change", reason, inputs, state, values, change=change)


@dataclass(frozen=True, slots=True)
class _HandoverMove:
    """What the hand-over budget asks of this tick: a new `handover_above` (None: none) and the state to keep."""

    value: float | None
    why: str
    state: ControllerState


def _handover(t: _Tick, state: ControllerState) -> _HandoverMove:
    """Keep the hand-over share under `handover_budget`: raise `handover_above` while over, lower it back toward
    its base once under (see the module docstring). `state`: the state the heavy-share stages decided."""
    w, th, cfg = t.w, t.th, t.cfg
    cur, budget = th.handover_above, th.handover_budget
    if state.handover_set is not None and cur != state.handover_set:
        # written by someone else since (an operator's set or rollback): their value is the base from now on
        state = replace(state, handover_base=None, handover_set=None)
    base = state.handover_base
    before = handover_share(w.oos, cur)
    t.inputs.update(handover_predicted=round(before, 4), oos_scores=w.oos.count, handover_base=base)
    if HANDOVER_KNOB in th.pinned:
        return _HandoverMove(None, "", state)
    over = before > budget + cfg.deadband
    lower_to = base if base is not None and cur > base and before < budget - cfg.deadband else None
    if not over and lower_to is None:
        return _HandoverMove(None, "", state)
    if w.oos.count < cfg.min_oos_scores:
        return _HandoverMove(None, f"{w.oos.count} out-of-scope scores (< {cfg.min_oos_scores}): handover_above "
                                   "kept", state)
    lo, hi = BOUNDS[HANDOVER_KNOB]
    want = calibrate_handover(w.oos, budget)
    if over:
        new = _clamp(min(want, cur + cfg.max_handover_step), cur, hi)
        if new - cur < cfg.min_handover_delta:
            return _HandoverMove(None, f"hand-over share {before:.3f} over budget {budget:.3f}, but handover_above "
                                       f"{cur:.4g} is at its bound", state)
        state = replace(state, handover_base=cur if base is None else base, handover_set=round(new, 4))
    elif lower_to is not None:
        # never below the base, nor where the prediction would break the budget
        new = _clamp(max(lower_to, want, cur - cfg.max_handover_step), lo, cur)
        if cur - new < cfg.min_handover_delta and new != lower_to:
            return _HandoverMove(None, "", state)
        done = new <= lower_to  # back at the base: the controller holds it raised no more
        state = replace(state, handover_base=None if done else lower_to, handover_set=None if done else round(new, 4))
    new = round(new, 4)
    after = handover_share(w.oos, new)
    t.inputs.update(handover_after=round(after, 4), handover_quantile=round(want, 4))
    what = "over" if over else "under"
    back = " (its base)" if not over and new == base else ""
    why = (f"hand-over share {w.handover_share:.3f} of {w.finals} answers ({w.handovers} handed over; predicted "
           f"{before:.3f}) {what} budget {budget:.3f}: handover_above {_fmt(cur)} -> {_fmt(new)}{back} "
           f"(predicted {after:.3f})")
    return _HandoverMove(new, why, state)


def _with_handover(d: Decision, m: _HandoverMove) -> Decision:
    """The heavy-share stages' decision `d` with the hand-over move in the same write (one decision per tick).

    A move on a hold becomes a change of its own without a `Change` to watch: the one under watch (if any) stays."""
    if m.value is None:
        reason = f"{d.reason}; {m.why}" if m.why else d.reason
        return replace(d, reason=reason, state=replace(d.state, handover_base=m.state.handover_base,
                                                       handover_set=m.state.handover_set))
    state = replace(d.state, handover_base=m.state.handover_base, handover_set=m.state.handover_set)
    if d.action == "hold":
        return Decision("change", f"{m.why}; {d.reason}", d.inputs, state, {HANDOVER_KNOB: m.value})
    return replace(d, reason=f"{d.reason}; {m.why}", state=state, values={**d.values, HANDOVER_KNOB: m.value})


def _restore(w: WindowStats, th: Thresholds, state: ControllerState, now_s: float,
             values: dict[str, float | int], inputs: dict[str, Any], notes: list[str], seen: str,
             heavy_p95_ms: float | None, recent: WindowStats | None, cfg: ControllerConfig) -> Decision:
    """Put back the thresholds from before the shed, as a change watched like any other."""
    before = predicted_share(w, th.length_threshold, th.escalate_below)
    after_share = predicted_share(w, values.get("length_threshold", th.length_threshold),
                                  values.get("escalate_below", th.escalate_below))
    inputs.update(restore_of=state.home_version, predicted_share=round(before, 4),
                  predicted_after=round(after_share, 4))
    reason = _join(notes, f"restore: heavy tier healthy again ({seen}): back to v{state.home_version} from before "
                          f"the shed: {_moves(th, values)} (predicted heavy share {before:.3f} -> {after_share:.3f})")
    ref = recent if recent is not None and recent.labeled >= cfg.min_check_labeled else w
    change = Change(version=0, previous_version=th.version, at_s=now_s,
                    values_before={k: getattr(th, k) for k in values}, values_after=dict(values),
                    direction=_direction(before, after_share), shed=False, baseline_accuracy=ref.accuracy,
                    baseline_heavy_p95_ms=heavy_p95_ms, baseline_labeled=ref.labeled, restore=True)
    return Decision("change", reason, inputs, state, values, change=change)


def _moves(th: Thresholds, values: Mapping[str, float | int]) -> str:
    return ", ".join(f"{k} {_fmt(getattr(th, k))} -> {_fmt(v)}" for k, v in values.items())


def _fmt(v: float | int) -> str:
    return str(v) if isinstance(v, int) else f"{v:.4g}"


def _join(notes: list[str], main: str) -> str:
    return "; ".join([*notes, main])

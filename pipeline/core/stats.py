"""Pure windowed statistics of the results stream (no I/O): what the feedback agent measures.

`Aggregator` takes decoded result and label records and keeps
- hopping windows: buckets of `hop_ms` by event time (`answered_at`), a window is the buckets of the
  last `window_ms`; per tier and per model: counts, latency / queue-wait histograms, batch sizes,
  escalation and degradation counts, abstentions and hand-overs to a person (issue 20), accuracy against
  ground truth, shadow agreement; plus the three distributions the controller calibrates on (light
  confidence, request length, the final stages' out-of-scope scores);
- the last N outcomes per model for the design article's score;
- pending joins: labels waiting for their results and results waiting for labels (TTL), light
  answers and shadow predictions waiting for each other (TTL);
- the results routed under the controller's latest change (`since`), for rollback checks;
- the last processed offset per partition, so records re-delivered after a restart count once.

Everything is mergeable and round-trips through `to_json` / `from_json`, so the agent can keep it in
Redis and restore it on start. Histograms are log-bucketed (about 2% relative error) to stay small.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.contracts.records import Result
from pipeline.core.routing import in_sample

SNAPSHOT_VERSION = 1
TEXT_TIERS = ("light", "heavy")

_G = math.log(1.02)  # log-histogram growth factor: bin width is ~2% of the value


class Distribution(Protocol):
    """What the controller needs of a distribution."""

    @property
    def count(self) -> int: ...

    def cdf(self, x: float) -> float:
        """Share of values below `x` (0..1)."""
        ...

    def quantile(self, q: float) -> float | None:
        """The value below which a share `q` of the values lies; None when empty."""
        ...


# --------------------------------------------------------------------------- histograms
def _log_bin(v: float) -> int:
    return 0 if v <= 0.0 else 1 + int(math.log1p(v) / _G)


def _log_edges(i: int) -> tuple[float, float]:
    if i <= 0:
        return 0.0, 0.0
    return math.expm1((i - 1) * _G), math.expm1(i * _G)


class LogHistogram:
    """Sparse log-bucketed histogram of non-negative values (ms, characters); mergeable, JSON-able."""

    __slots__ = ("bins", "count", "total")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.count = 0
        self.total = 0.0

    def add(self, v: float, n: int = 1) -> None:
        b = _log_bin(v)
        self.bins[b] = self.bins.get(b, 0) + n
        self.count += n
        self.total += v * n

    def merge(self, other: LogHistogram) -> None:
        for b, n in other.bins.items():
            self.bins[b] = self.bins.get(b, 0) + n
        self.count += other.count
        self.total += other.total

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        if self.count == 0:
            return None
        rank = min(max(q, 0.0), 1.0) * self.count
        seen = 0
        for b in sorted(self.bins):
            n = self.bins[b]
            if seen + n >= rank:
                lo, hi = _log_edges(b)
                return lo + (hi - lo) * ((rank - seen) / n)
            seen += n
        return _log_edges(max(self.bins))[1]

    def cdf(self, x: float) -> float:
        if self.count == 0:
            return 0.0
        below = 0.0
        for b, n in self.bins.items():
            lo, hi = _log_edges(b)
            if hi <= x:
                below += n
            elif lo < x:
                below += n * (x - lo) / (hi - lo)
        return min(1.0, below / self.count)

    def to_json(self) -> list[Any]:
        return [self.count, self.total, [[b, n] for b, n in self.bins.items()]]

    @classmethod
    def from_json(cls, data: list[Any]) -> LogHistogram:
        h = cls()
        h.count, h.total = int(data[0]), float(data[1])
        h.bins = {int(b): int(n) for b, n in data[2]}
        return h


class LinearHistogram:
    """Fixed-width histogram of values in [0, 1] (confidences): `nbins` bins, interpolated within a bin.

    Exactly 1.0 (models that saturate, the echo model) has a slot of its own past the last bin: spread
    over [1 - 1/nbins, 1) it would look escalatable to an `escalate_below` just under 1.
    """

    __slots__ = ("count", "counts", "nbins")

    def __init__(self, nbins: int = 200) -> None:
        self.nbins = nbins
        self.counts = [0] * (nbins + 1)
        self.count = 0

    def add(self, v: float, n: int = 1) -> None:
        i = self.nbins if v >= 1.0 else max(0, int(v * self.nbins))
        self.counts[i] += n
        self.count += n

    def merge(self, other: LinearHistogram) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.count += other.count

    def cdf(self, x: float) -> float:
        """Share of values below `x` (escalation happens for confidence < escalate_below)."""
        if self.count == 0 or x <= 0.0:
            return 0.0
        if x > 1.0:
            return 1.0
        pos = x * self.nbins
        i = int(pos)
        below = sum(self.counts[:i]) + (self.counts[i] * (pos - i) if i < self.nbins else 0)
        return below / self.count

    def quantile(self, q: float) -> float | None:
        if self.count == 0:
            return None
        rank = min(max(q, 0.0), 1.0) * self.count
        if rank <= 0:
            first = next(i for i, n in enumerate(self.counts) if n)
            return first / self.nbins
        seen = 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                return min(1.0, (i + (rank - seen) / n) / self.nbins)
            seen += n
        return 1.0

    def to_json(self) -> list[Any]:
        return [self.nbins, [[i, n] for i, n in enumerate(self.counts) if n]]

    @classmethod
    def from_json(cls, data: list[Any]) -> LinearHistogram:
        h = cls(int(data[0]))
        for i, n in data[1]:
            h.counts[int(i)] = int(n)
        h.count = sum(h.counts)
        return h


# --------------------------------------------------------------------------- per-bucket aggregates
@dataclass
class TierAgg:
    """One tier in one bucket. Final answers carry latency and accuracy; stage results carry the rest."""

    finals: int = 0
    stage: int = 0  # non-shadow results of this stage (finals + escalated-away)
    eligible: int = 0  # light first-stage results that could escalate (not degraded)
    escalated_out: int = 0  # light results handed to heavy
    escalated_in: int = 0  # heavy finals that were escalations
    degraded: int = 0  # finals routed here because heavy was unhealthy
    labeled: int = 0
    correct: int = 0
    ratings: int = 0
    rating_sum: int = 0
    agree_n: int = 0
    agree: int = 0
    batch_sum: int = 0
    abstained: int = 0  # stage results over their out-of-scope threshold (light: escalated; else: handed over)
    handovers: int = 0  # finals handed over to a person
    latency: LogHistogram = field(default_factory=LogHistogram)  # end-to-end ms of finals
    queue: LogHistogram = field(default_factory=LogHistogram)  # queue wait ms of stage results
    handover_reasons: dict[str, int] = field(default_factory=dict)  # `handovers` by `handover_reason`

    _COUNTS = ("finals", "stage", "eligible", "escalated_out", "escalated_in", "degraded", "labeled",
               "correct", "ratings", "rating_sum", "agree_n", "agree", "batch_sum", "abstained", "handovers")

    def merge(self, o: TierAgg) -> None:
        for k in self._COUNTS:
            setattr(self, k, getattr(self, k) + getattr(o, k))
        self.latency.merge(o.latency)
        self.queue.merge(o.queue)
        for why, n in o.handover_reasons.items():
            self.handover_reasons[why] = self.handover_reasons.get(why, 0) + n

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in self._COUNTS if getattr(self, k)}
        d["lat"], d["queue"] = self.latency.to_json(), self.queue.to_json()
        if self.handover_reasons:
            d["handover_reasons"] = dict(self.handover_reasons)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TierAgg:
        t = cls()
        for k in cls._COUNTS:
            setattr(t, k, int(d.get(k, 0)))
        t.latency, t.queue = LogHistogram.from_json(d["lat"]), LogHistogram.from_json(d["queue"])
        t.handover_reasons = {str(k): int(n) for k, n in d.get("handover_reasons", {}).items()}
        return t


@dataclass
class ModelAgg:
    """One model in one bucket: its own predictions (stage and shadow results)."""

    results: int = 0
    labeled: int = 0
    correct: int = 0
    latency: LogHistogram = field(default_factory=LogHistogram)  # end-to-end ms of its results
    inference: LogHistogram = field(default_factory=LogHistogram)

    def merge(self, o: ModelAgg) -> None:
        self.results += o.results
        self.labeled += o.labeled
        self.correct += o.correct
        self.latency.merge(o.latency)
        self.inference.merge(o.inference)

    def to_json(self) -> dict[str, Any]:
        return {"n": self.results, "labeled": self.labeled, "correct": self.correct,
                "lat": self.latency.to_json(), "inf": self.inference.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelAgg:
        return cls(int(d["n"]), int(d["labeled"]), int(d["correct"]), LogHistogram.from_json(d["lat"]),
                   LogHistogram.from_json(d["inf"]))


@dataclass
class Bucket:
    """Everything observed in one hop of event time."""

    start_ms: int
    tiers: dict[str, TierAgg] = field(default_factory=dict)
    models: dict[str, ModelAgg] = field(default_factory=dict)  # key "tier/model"
    confidence: LinearHistogram = field(default_factory=LinearHistogram)  # eligible light results
    chars: LogHistogram = field(default_factory=LogHistogram)  # non-VIP text requests (finals)
    vip: int = 0  # VIP text requests (finals)
    oos: LinearHistogram = field(default_factory=LinearHistogram)  # out-of-scope scores of finals (all tiers)

    def tier(self, name: str) -> TierAgg:
        t = self.tiers.get(name)
        if t is None:
            t = self.tiers[name] = TierAgg()
        return t

    def model(self, key: str) -> ModelAgg:
        m = self.models.get(key)
        if m is None:
            m = self.models[key] = ModelAgg()
        return m

    def merge(self, o: Bucket) -> None:
        for k, t in o.tiers.items():
            self.tier(k).merge(t)
        for k, m in o.models.items():
            self.model(k).merge(m)
        self.confidence.merge(o.confidence)
        self.chars.merge(o.chars)
        self.vip += o.vip
        self.oos.merge(o.oos)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start_ms, "tiers": {k: t.to_json() for k, t in self.tiers.items()},
                "models": {k: m.to_json() for k, m in self.models.items()},
                "conf": self.confidence.to_json(), "chars": self.chars.to_json(), "vip": self.vip,
                "oos": self.oos.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Bucket:
        # "oos": absent from snapshots written before issue 20 (their finals had no scores: none to restore)
        return cls(int(d["start"]), {k: TierAgg.from_json(v) for k, v in d["tiers"].items()},
                   {k: ModelAgg.from_json(v) for k, v in d["models"].items()},
                   LinearHistogram.from_json(d["conf"]), LogHistogram.from_json(d["chars"]), int(d["vip"]),
                   LinearHistogram.from_json(d["oos"]) if "oos" in d else LinearHistogram())


@dataclass
class SinceChange:
    """Final answers routed under threshold version >= `version` (the controller's latest change)."""

    version: int
    results: int = 0
    heavy: int = 0
    labeled: int = 0
    correct: int = 0
    heavy_latency: LogHistogram = field(default_factory=LogHistogram)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "results": self.results, "heavy": self.heavy, "labeled": self.labeled,
                "correct": self.correct, "lat": self.heavy_latency.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SinceChange:
        return cls(int(d["version"]), int(d["results"]), int(d["heavy"]), int(d["labeled"]), int(d["correct"]),
                   LogHistogram.from_json(d["lat"]))


# --------------------------------------------------------------------------- what the controller reads
@dataclass(frozen=True, slots=True)
class TierWindow:
    """One tier over the window."""

    finals: int
    results: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    queue_p50_ms: float | None
    queue_p95_ms: float | None
    batch_mean: float | None
    escalation_rate: float  # light: share of eligible results escalated; heavy: share of finals escalated
    degradation_rate: float  # share of finals that were degraded
    accuracy: float | None  # finals against ground truth
    labeled: int
    agreement: float | None  # light finals agreeing with heavy's shadow prediction
    agreed: int  # shadow pairs behind `agreement`
    rating: float | None  # mean customer rating 1-5
    abstained: int = 0  # stage results over their out-of-scope threshold
    abstention_rate: float = 0.0  # share of the stage results that abstained
    handovers: int = 0  # finals handed over to a person
    handover_reasons: Mapping[str, int] = field(default_factory=dict)  # `handovers` by reason


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """One model over the window."""

    tier: str
    model: str
    results: int
    p95_ms: float | None
    mean_ms: float | None
    inference_mean_ms: float | None
    accuracy: float | None
    labeled: int


@dataclass(frozen=True, slots=True)
class WindowStats:
    """The window as the controller sees it. Shares are of text final answers (light + heavy)."""

    tiers: Mapping[str, TierWindow]
    text_finals: int
    heavy_share: float
    rule_heavy_share: float  # heavy finals that were routed there by a rule, not escalated
    escalated_share: float
    degraded_share: float
    vip_share: float
    confidence: Distribution  # confidence of light results that could escalate
    chars: Distribution  # length of non-VIP text requests
    accuracy: float | None  # all text finals against ground truth
    labeled: int
    models: Mapping[str, ModelWindow] = field(default_factory=dict)
    # hand-overs to a person (issue 20): shares of all final answers, text and multimodal, as `handover_budget` is
    finals: int = 0
    handovers: int = 0
    handover_share: float = 0.0
    oos: Distribution = field(default_factory=LinearHistogram)  # out-of-scope scores of the finals

    def tier(self, name: str) -> TierWindow | None:
        return self.tiers.get(name)


@dataclass(frozen=True, slots=True)
class AfterChange:
    """Final answers routed under the controller's latest change, for its rollback check."""

    version: int
    results: int
    labeled: int
    accuracy: float | None
    heavy: int
    heavy_p95_ms: float | None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _tier_window(t: TierAgg, tier: str) -> TierWindow:
    esc_n, esc_of = (t.escalated_out, t.eligible) if tier == "light" else (t.escalated_in, t.finals)
    esc = _ratio(esc_n, esc_of) or 0.0
    return TierWindow(
        finals=t.finals, results=t.stage,
        p50_ms=t.latency.quantile(0.5), p95_ms=t.latency.quantile(0.95), p99_ms=t.latency.quantile(0.99),
        queue_p50_ms=t.queue.quantile(0.5), queue_p95_ms=t.queue.quantile(0.95),
        batch_mean=_ratio(t.batch_sum, t.stage),
        escalation_rate=esc, degradation_rate=_ratio(t.degraded, t.finals) or 0.0,
        accuracy=_ratio(t.correct, t.labeled), labeled=t.labeled,
        agreement=_ratio(t.agree, t.agree_n), agreed=t.agree_n,
        rating=_ratio(t.rating_sum, t.ratings),
        abstained=t.abstained, abstention_rate=_ratio(t.abstained, t.stage) or 0.0,
        handovers=t.handovers, handover_reasons=dict(t.handover_reasons),
    )


def summarize(buckets: Iterable[Bucket]) -> WindowStats:
    """Merge buckets into the controller's view."""
    total = Bucket(0)
    for b in buckets:
        total.merge(b)
    tiers = {k: _tier_window(t, k) for k, t in total.tiers.items()}
    light, heavy = total.tiers.get("light", TierAgg()), total.tiers.get("heavy", TierAgg())
    text = light.finals + heavy.finals
    finals = sum(t.finals for t in total.tiers.values())
    handovers = sum(t.handovers for t in total.tiers.values())
    models = {}
    for key, m in total.models.items():
        tier, _, model = key.partition("/")
        models[key] = ModelWindow(tier, model, m.results, m.latency.quantile(0.95), m.latency.mean(),
                                  m.inference.mean(), _ratio(m.correct, m.labeled), m.labeled)
    return WindowStats(
        tiers=tiers, text_finals=text,
        heavy_share=_ratio(heavy.finals, text) or 0.0,
        rule_heavy_share=_ratio(heavy.finals - heavy.escalated_in, text) or 0.0,
        escalated_share=_ratio(heavy.escalated_in, text) or 0.0,
        degraded_share=_ratio(light.degraded + heavy.degraded, text) or 0.0,
        vip_share=_ratio(total.vip, text) or 0.0,
        confidence=total.confidence, chars=total.chars,
        accuracy=_ratio(light.correct + heavy.correct, light.labeled + heavy.labeled),
        labeled=light.labeled + heavy.labeled,
        models=models,
        finals=finals, handovers=handovers, handover_share=_ratio(handovers, finals) or 0.0,
        oos=total.oos,
    )


# --------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class Observed:
    """The fields of a result record the statistics use (see schemas/result.v1.json)."""

    request_id: str
    tier: str
    model: str
    intent: str
    confidence: float
    final: bool
    shadow: bool
    escalated: bool
    degraded: bool
    version: int
    at_ms: int
    # Received to produced, less the writer's time (`write_ms`, and `writer_wait` in the record: other requests'
    # writing it waited through): the SLOs and the model scores judge how fast a tier decides; the heavy tier's
    # writer answers to its own time budget (generator.timeout_s), past which the template goes out. Judged with
    # the writing in, a 1.5B writer on a CPU (seconds a reply) would shed all heavy traffic to light, writer and all.
    total_ms: float
    queue_ms: float
    inference_ms: float
    batch_size: int
    chars: int  # the routed length (features `length`, English-equivalent characters; `chars` in older records)
    vip: bool
    label: str | None
    # issue 20; absent from older workers' records: a score of 0 that never abstained nor handed over
    oos_score: float = 0.0
    abstained: bool = False
    handover: bool = False
    handover_reason: str | None = None
    write_ms: float = 0.0

    @classmethod
    def of(cls, rec: Result) -> Observed:
        """From a result record (`records.result_of`); raises KeyError / TypeError / ValueError when it is not one."""
        t = rec["timings_ms"]
        feats = rec["features"]
        stamps = rec.get("timestamps")
        at = rec.get("answered_at") or (stamps.get("produced") if stamps else None) or 0
        label = rec.get("label")
        write = float(t.get("write") or 0.0)
        waited = write + float(t.get("writer_wait") or 0.0)
        return cls(
            request_id=str(rec["request_id"]), tier=str(rec.get("stage") or rec["tier"]), model=str(rec["model"]),
            intent=str(rec["intent"]), confidence=float(rec["confidence"]), final=bool(rec["final"]),
            shadow=bool(rec["shadow"]), escalated=bool(rec["escalated"]), degraded=bool(rec["degraded"]),
            version=int(rec["threshold_version"]), at_ms=int(at), total_ms=max(0.0, float(t["total"]) - waited),
            queue_ms=float(t["queue"]), inference_ms=max(0.0, float(t["inference"]) - write),
            batch_size=int(rec["batch_size"]),
            chars=int(feats.get("length", feats["chars"])), vip=bool(feats["vip"]), label=str(label) if label else None,
            oos_score=float(rec.get("oos_score") or 0.0), abstained=bool(rec.get("abstained")),
            handover=bool(rec.get("handover")),
            handover_reason=str(rec.get("handover_reason") or "unknown") if rec.get("handover") else None,
            write_ms=write,
        )


@dataclass(frozen=True, slots=True)
class Pending:
    """A result waiting for its label: what to credit when the label arrives."""

    at_ms: int
    tier: str
    model: str
    intent: str
    final: bool
    version: int

    def to_json(self) -> list[Any]:
        return [self.at_ms, self.tier, self.model, self.intent, self.final, self.version]

    @classmethod
    def from_json(cls, d: list[Any]) -> Pending:
        return cls(int(d[0]), str(d[1]), str(d[2]), str(d[3]), bool(d[4]), int(d[5]))


@dataclass(frozen=True, slots=True)
class AggConfig:
    """Window shape and join limits."""

    window_ms: int = 30_000
    hop_ms: int = 2_000
    # How far back a window may reach when traffic is low (`Aggregator.sized_window`): the buckets are kept this
    # long. None: the window alone (every window is window_ms).
    max_window_ms: int | None = None
    last_n: int = 500  # outcomes per model kept for the score
    label_ttl_ms: int = 300_000  # how long a label or a result waits for its partner
    shadow_ttl_ms: int = 60_000
    max_pending: int = 20_000  # per join; the oldest are dropped beyond this
    future_slack_ms: int = 5_000  # event times this far ahead of the clock are clamped to now

    def __post_init__(self) -> None:
        if self.hop_ms <= 0 or self.window_ms < self.hop_ms:
            raise ValueError("need 0 < hop_ms <= window_ms")
        if self.max_window_ms is not None and self.max_window_ms < self.window_ms:
            raise ValueError("need max_window_ms >= window_ms")

    @property
    def retain_ms(self) -> int:
        """How long buckets are kept: the longest window asked of them."""
        return max(self.window_ms, self.max_window_ms or 0)


@dataclass
class Recent:
    """The last N outcomes of one model: latencies, label outcomes, shadow agreement (light only)."""

    latency: deque[float]
    correct: deque[int]
    agree: deque[int]

    @classmethod
    def new(cls, n: int) -> Recent:
        return cls(deque(maxlen=n), deque(maxlen=n), deque(maxlen=n))

    def to_json(self) -> list[Any]:
        return [list(self.latency), list(self.correct), list(self.agree)]

    @classmethod
    def from_json(cls, d: list[Any], n: int) -> Recent:
        return cls(deque((float(x) for x in d[0]), maxlen=n), deque((int(x) for x in d[1]), maxlen=n),
                   deque((int(x) for x in d[2]), maxlen=n))

    def extend(self, o: Recent) -> None:
        self.latency.extend(o.latency)
        self.correct.extend(o.correct)
        self.agree.extend(o.agree)


def _trim(d: dict[str, Any], limit: int) -> int:
    """Drop the oldest entries of an insertion-ordered dict beyond `limit`; how many were dropped."""
    dropped = 0
    while len(d) > limit:
        del d[next(iter(d))]
        dropped += 1
    return dropped


class Aggregator:
    """The feedback agent's whole measured state. Feed it records; read `window()`; persist `to_json()`."""

    def __init__(self, cfg: AggConfig | None = None) -> None:
        self.cfg = cfg or AggConfig()
        self.buckets: dict[int, Bucket] = {}
        self.recent: dict[str, Recent] = {}  # key "tier/model"
        # joins, all insertion-ordered (oldest first) so expiry pops from the front
        self.labels: dict[str, tuple[int, str | None, int | None]] = {}  # rid -> (at, intent, rating)
        self.awaiting: dict[str, list[Pending]] = {}  # rid -> results waiting for a label
        self.light: dict[str, tuple[int, str, str]] = {}  # rid -> (at, light intent, model), for shadow joins
        self.shadows: dict[str, tuple[int, str]] = {}  # rid -> (at, heavy shadow intent)
        self.since: SinceChange | None = None
        self.offsets: dict[str, tuple[int, int]] = {}  # "topic:partition" -> (last offset, newest timestamp ms)
        self.labels_seen_ms = 0  # event time of the last label seen: results wait for labels only then
        self.shadow_rate = 0.0  # the thresholds' shadow rate: which light answers to keep for a join
        self.observed = 0  # results counted since the first start (survives restarts)
        self.invalid = 0
        self.late = 0  # results older than the window
        self.dropped = 0  # pending join entries dropped over `max_pending`
        self.labeled = 0  # final answers credited with ground truth (inline or joined)

    # --- offsets ---
    def fresh(self, tp: str, offset: int, ts_ms: int = 0) -> bool:
        """True (and remembered) unless `offset` of partition `tp` was already processed.

        `ts_ms`: the record's timestamp, which tells a re-delivery from a recreated topic.
        """
        last = self.offsets.get(tp)
        if last is not None and offset <= last[0] and not ts_ms > last[1] > 0:
            # at or below the last offset and no newer than anything seen: a re-delivery. (A record newer
            # than everything seen at a low offset means the topic was recreated: count it.)
            return False
        newest = max(ts_ms, last[1]) if last is not None and offset > last[0] else ts_ms
        self.offsets[tp] = (offset, newest)
        return True

    # --- records ---
    def _bucket(self, at_ms: int, now_ms: int) -> Bucket | None:
        at = now_ms if at_ms <= 0 or at_ms > now_ms + self.cfg.future_slack_ms else at_ms
        start = at - at % self.cfg.hop_ms
        if start <= now_ms - self.cfg.retain_ms:
            return None
        b = self.buckets.get(start)
        if b is None:
            b = self.buckets[start] = Bucket(start)
        return b

    def _recent(self, key: str) -> Recent:
        r = self.recent.get(key)
        if r is None:
            r = self.recent[key] = Recent.new(self.cfg.last_n)
        return r

    def add_result(self, rec: Result, now_ms: int) -> bool:
        """Count one result record; False (and counted as invalid) when it is not a result."""
        try:
            o = Observed.of(rec)
        except (KeyError, TypeError, ValueError):
            self.invalid += 1
            return False
        self.observe(o, now_ms)
        return True

    def observe(self, o: Observed, now_ms: int) -> None:
        self.observed += 1
        b = self._bucket(o.at_ms, now_ms)
        if b is None:
            self.late += 1
        mkey = f"{o.tier}/{o.model}"
        rec = self._recent(mkey)
        rec.latency.append(o.total_ms)
        if b is not None:
            m = b.model(mkey)
            m.results += 1
            m.latency.add(o.total_ms)
            m.inference.add(o.inference_ms)
        truth = o.label
        if truth is None and o.request_id in self.labels:
            truth = self.labels[o.request_id][1]
        if truth is not None:
            self._credit_model(b, mkey, o.intent == truth)
        if o.shadow:
            self._shadow(o, b, now_ms)
            return
        t = b.tier(o.tier) if b is not None else None
        if t is not None and b is not None:
            t.stage += 1
            t.batch_sum += o.batch_size
            t.queue.add(o.queue_ms)
            t.abstained += o.abstained
            if o.tier == "light" and not o.degraded and not o.escalated:
                t.eligible += 1
                # An abstention escalates whatever escalate_below is: kept as confidence 0 (below any threshold),
                # the share model predicts it, instead of missing it from the heavy share it aims at the budget.
                b.confidence.add(0.0 if o.abstained and not o.final else o.confidence)
                if not o.final:
                    t.escalated_out += 1
        if not o.final:
            self.shadows.pop(o.request_id, None)  # an escalated light answer never meets a shadow
        else:
            self._final(o, b, t, truth, now_ms)
        if truth is None and self.labels_seen_ms and now_ms - self.labels_seen_ms < self.cfg.label_ttl_ms:
            self.awaiting.setdefault(o.request_id, []).append(
                Pending(now_ms, o.tier, o.model, o.intent, o.final, o.version))
        if o.request_id in self.labels:
            rating = self.labels[o.request_id][2]
            if rating is not None and o.final and t is not None:
                t.ratings += 1
                t.rating_sum += rating

    def _final(self, o: Observed, b: Bucket | None, t: TierAgg | None, truth: str | None, now_ms: int) -> None:
        if t is not None and b is not None:
            t.finals += 1
            t.latency.add(o.total_ms)
            b.oos.add(o.oos_score)  # what `handover_above` is compared with (`observe` returned on a shadow)
            if o.handover:
                t.handovers += 1
                why = o.handover_reason or "unknown"
                t.handover_reasons[why] = t.handover_reasons.get(why, 0) + 1
            if o.degraded:
                t.degraded += 1
            if o.tier == "heavy" and o.escalated:
                t.escalated_in += 1
            if o.tier in TEXT_TIERS:
                if o.vip:
                    b.vip += 1
                else:
                    b.chars.add(o.chars)
            if truth is not None:
                t.labeled += 1
                t.correct += o.intent == truth
        if truth is not None:
            self.labeled += 1
        s = self.since
        if s is not None and o.version >= s.version and o.tier in TEXT_TIERS:
            s.results += 1
            if o.tier == "heavy":
                s.heavy += 1
                s.heavy_latency.add(o.total_ms)
            if truth is not None:
                s.labeled += 1
                s.correct += o.intent == truth
        if o.tier == "light" and not o.escalated:
            shadow = self.shadows.pop(o.request_id, None)
            if shadow is not None:
                self._agree(b, f"{o.tier}/{o.model}", o.intent == shadow[1])
            elif in_sample(o.request_id, self.shadow_rate):
                self.light[o.request_id] = (now_ms, o.intent, f"{o.tier}/{o.model}")
                self.dropped += _trim(self.light, self.cfg.max_pending)

    def _shadow(self, o: Observed, b: Bucket | None, now_ms: int) -> None:
        light = self.light.pop(o.request_id, None)
        if light is not None:
            self._agree(b, light[2], light[1] == o.intent)
        else:
            self.shadows[o.request_id] = (now_ms, o.intent)
            self.dropped += _trim(self.shadows, self.cfg.max_pending)

    def _agree(self, b: Bucket | None, light_model: str, agreed: bool) -> None:
        if b is not None:
            t = b.tier("light")
            t.agree_n += 1
            t.agree += agreed
        self._recent(light_model).agree.append(int(agreed))

    def _credit_model(self, b: Bucket | None, mkey: str, correct: bool) -> None:
        self._recent(mkey).correct.append(int(correct))
        if b is not None:
            m = b.model(mkey)
            m.labeled += 1
            m.correct += correct

    def add_label(self, rec: Mapping[str, Any], now_ms: int) -> bool:
        """Ground truth for a request: credit results already seen, else keep it for those to come."""
        try:
            rid = str(rec["request_id"])
            intent = rec.get("intent")
            rating = rec.get("rating")
            intent = str(intent) if intent else None
            rating = int(rating) if rating is not None else None
        except (KeyError, TypeError, ValueError):
            self.invalid += 1
            return False
        if intent is None and rating is None:
            self.invalid += 1
            return False
        self.labels_seen_ms = now_ms
        self.labels[rid] = (now_ms, intent, rating)
        self.dropped += _trim(self.labels, self.cfg.max_pending)
        waiting = self.awaiting.pop(rid, None)
        if not waiting:
            return True
        b = self._bucket(now_ms, now_ms)
        for p in waiting:
            mkey = f"{p.tier}/{p.model}"
            if intent is not None:
                self._credit_model(b, mkey, p.intent == intent)
            if not p.final:
                continue
            if intent is not None:
                self.labeled += 1
            if b is None:
                continue
            t = b.tier(p.tier)
            if intent is not None:
                t.labeled += 1
                t.correct += p.intent == intent
                s = self.since
                if s is not None and p.version >= s.version and p.tier in TEXT_TIERS:
                    s.labeled += 1
                    s.correct += p.intent == intent
            if rating is not None:
                t.ratings += 1
                t.rating_sum += rating
        return True

    # --- time ---
    def expire(self, now_ms: int) -> None:
        """Drop buckets out of the longest window and join entries past their TTL."""
        cutoff = now_ms - self.cfg.retain_ms
        for start in [s for s in self.buckets if s <= cutoff]:
            del self.buckets[start]
        for d, ttl in ((self.labels, self.cfg.label_ttl_ms), (self.light, self.cfg.shadow_ttl_ms),
                       (self.shadows, self.cfg.shadow_ttl_ms)):
            while d:
                k = next(iter(d))
                if now_ms - d[k][0] <= ttl:
                    break
                del d[k]
        while self.awaiting:
            k = next(iter(self.awaiting))
            if now_ms - self.awaiting[k][0].at_ms <= self.cfg.label_ttl_ms:
                break
            del self.awaiting[k]
        self.dropped += _trim(self.awaiting, self.cfg.max_pending)

    def window(self, now_ms: int, span_ms: int | None = None) -> WindowStats:
        """The last `span_ms` (default: the window; at most `max_window_ms`), in whole buckets."""
        cutoff = now_ms - min(span_ms or self.cfg.window_ms, self.cfg.retain_ms)
        return summarize(b for s, b in self.buckets.items() if s > cutoff)

    def sized_window(self, now_ms: int, min_text_finals: int) -> tuple[WindowStats, int]:
        """The window, widened (doubling, up to `max_window_ms`) until it holds `min_text_finals` text answers;
        and its span in ms.

        At 2 msg/s a 30 s window holds 60 answers: too few for the controller to act on (its share estimate
        would be off by +-6 points), so it never acted and an over-budget heavy share stayed. A longer window
        at low traffic gives the controller the same evidence, later; at normal traffic nothing changes.
        """
        span = self.cfg.window_ms
        w = self.window(now_ms, span)
        while w.text_finals < min_text_finals and span < self.cfg.retain_ms:
            span = min(2 * span, self.cfg.retain_ms)
            w = self.window(now_ms, span)
        return w, span

    # --- the controller's latest change ---
    def track_since(self, version: int | None) -> None:
        """Count final answers routed under `version` or later (None: stop)."""
        self.since = SinceChange(version) if version is not None else None

    def after_change(self) -> AfterChange | None:
        s = self.since
        if s is None:
            return None
        return AfterChange(s.version, s.results, s.labeled, _ratio(s.correct, s.labeled), s.heavy,
                           s.heavy_latency.quantile(0.95))

    # --- persistence ---
    def to_json(self) -> dict[str, Any]:
        return {
            "v": SNAPSHOT_VERSION,
            "buckets": [b.to_json() for b in self.buckets.values()],
            "recent": {k: r.to_json() for k, r in self.recent.items()},
            "labels": [[k, *v] for k, v in self.labels.items()],
            "awaiting": [[k, [p.to_json() for p in ps]] for k, ps in self.awaiting.items()],
            "light": [[k, *v] for k, v in self.light.items()],
            "shadows": [[k, *v] for k, v in self.shadows.items()],
            "since": self.since.to_json() if self.since else None,
            "offsets": self.offsets,
            "labels_seen_ms": self.labels_seen_ms,
            "counters": {"observed": self.observed, "invalid": self.invalid, "late": self.late,
                         "labeled": self.labeled,
                         "dropped": self.dropped},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], cfg: AggConfig | None = None) -> Aggregator:
        if d.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown snapshot version {d.get('v')!r}")
        a = cls(cfg)
        for bj in d["buckets"]:
            b = Bucket.from_json(bj)
            b.start_ms -= b.start_ms % a.cfg.hop_ms  # the hop may have changed since the snapshot
            if b.start_ms in a.buckets:
                a.buckets[b.start_ms].merge(b)
            else:
                a.buckets[b.start_ms] = b
        a.recent = {k: Recent.from_json(v, a.cfg.last_n) for k, v in d["recent"].items()}
        a.labels = {k: (int(at), intent, rating) for k, at, intent, rating in d["labels"]}
        a.awaiting = {k: [Pending.from_json(p) for p in ps] for k, ps in d["awaiting"]}
        a.light = {k: (int(at), str(i), str(m)) for k, at, i, m in d["light"]}
        a.shadows = {k: (int(at), str(i)) for k, at, i in d["shadows"]}
        a.since = SinceChange.from_json(d["since"]) if d.get("since") else None
        a.offsets = {str(k): (int(v[0]), int(v[1])) for k, v in d["offsets"].items()}
        a.labels_seen_ms = int(d.get("labels_seen_ms", 0))
        c = d.get("counters", {})
        a.observed, a.invalid = int(c.get("observed", 0)), int(c.get("invalid", 0))
        a.late, a.dropped = int(c.get("late", 0)), int(c.get("dropped", 0))
        a.labeled = int(c.get("labeled", 0))
        return a

    def merge(self, o: Aggregator) -> None:
        """Fold `o` (e.g. a snapshot restored late, after Redis came back) into this one."""
        for start, b in o.buckets.items():
            if start in self.buckets:
                self.buckets[start].merge(b)
            else:
                self.buckets[start] = b
        for k, r in o.recent.items():
            mine = self._recent(k)
            merged = Recent.new(self.cfg.last_n)
            merged.extend(r)
            merged.extend(mine)
            self.recent[k] = merged
        self.labels = {**o.labels, **self.labels}
        for k, ps in o.awaiting.items():
            self.awaiting[k] = ps + self.awaiting.get(k, [])
        self.light = {**o.light, **self.light}
        self.shadows = {**o.shadows, **self.shadows}
        if self.since is None:
            self.since = o.since
        for tp, off in o.offsets.items():
            self.offsets[tp] = max(off, self.offsets.get(tp, (-1, 0)))
        self.labels_seen_ms = max(self.labels_seen_ms, o.labels_seen_ms)
        self.observed += o.observed
        self.invalid += o.invalid
        self.late += o.late
        self.dropped += o.dropped
        self.labeled += o.labeled

"""`tierflow status`: a live terminal view of a running pipeline, from Kafka and Redis alone.

Sources, all read-only (status never writes to Redis nor commits offsets):
- `tierflow.results`, tailed: answers/s, p95 latency, escalated / degraded rates, heavy share, abstentions and
  hand-overs to a person;
- `tierflow.dlq`, tailed: the last dead letters and their reasons (headers);
- worker heartbeats in Redis: live workers, lag and each worker's own p95 per tier;
- the thresholds document in Redis: version and key values.

A tail starts a little before the end of its topic so the first frame already has a window of data.
The end is found from fetch watermarks (assign at the beginning, read the high watermark from the
first fetch response, then move): tansu's ListOffsets end offsets and timestamp lookups are wrong,
and `auto.offset.reset=latest` relies on them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

import redis
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pipeline.adapters.dlq import headers_dict
from pipeline.adapters.heartbeats import read_heartbeats
from pipeline.adapters.kafka import check_reachable, make_consumer, poll_batch, topics_of
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import Keys
from pipeline.contracts.records import Heartbeat as HeartbeatDoc
from pipeline.contracts.records import result_of
from pipeline.contracts.topics import Tier
from pipeline.core.thresholds import Thresholds
from pipeline.logs import scrub
from pipeline.settings import Settings

log = logging.getLogger(__name__)

WINDOW_S = 10.0  # rates and percentiles are over the last WINDOW_S seconds
ONCE_COLLECT_S = 2.0  # the longest `--once` reads before its frame (it stops once the backlog is read)
RESULTS_BACKLOG = 2000  # records per partition read back at start, to fill the first window
DLQ_BACKLOG = 20
LAST_DLQ = 6

_TIERS = [t.value for t in Tier]
_THRESHOLD_KEYS = ("length_threshold", "escalate_below", "shadow_rate", "heavy_budget", "abstain_above",
                   "handover_above", "handover_budget", "light_slo_p95_ms", "heavy_slo_p95_ms", "degrade_lag")

# librdkafka logs straight to stderr by default, which would tear through the live display; the
# errors that matter also arrive as error events from consume(), and those are shown in the frame.
_QUIET = logging.getLogger("tierflow.status.kafka")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


# --------------------------------------------------------------------------- tails
class TopicTail:
    """Reads a topic from `backlog` records before its end (per partition) onward, without a group."""

    def __init__(self, settings: Settings, topic: str, backlog: int) -> None:
        self.topic, self.backlog = topic, backlog
        self.consumer = make_consumer(settings, f"tierflow-status-{uuid.uuid4().hex[:8]}", logger=_QUIET,
                                      **{"queued.max.messages.kbytes": 8192})
        self.missing = False
        self.covered_from_ms = 0  # records before this were skipped: windows must not reach further back
        self._start: dict[int, int] = {}
        self._end: dict[int, int | None] = {}  # per partition, its end when the tail started (None: not known)
        self._next: dict[int, int] = {}  # per partition, the offset after the last record read
        self._await_first: set[int] = set()
        self.errors: deque[str] = deque(maxlen=3)

    def start(self, timeout_s: float = 3.0) -> None:
        meta = self.consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            self.missing = True
            return
        parts = sorted(meta.partitions)
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
        marks: dict[int, tuple[int, int]] = {}
        deadline = time.monotonic() + timeout_s
        while len(marks) < len(parts) and time.monotonic() < deadline:
            self.consumer.consume(50, 0.005)  # only for the watermarks in the fetch responses (which come in ~1 ms)
            for p in parts:
                if p not in marks:
                    low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                    if high is not None and high >= 0:
                        marks[p] = (low, high)
        for p in parts:
            low, high = marks.get(p, (0, 0))
            self._end[p] = high if p in marks else None
            self._start[p] = self._next[p] = max(low, high - self.backlog)
            if self._start[p] > low:
                self._await_first.add(p)
        self.consumer.assign([TopicPartition(self.topic, p, self._start[p]) for p in parts])

    def poll(self, timeout_s: float, max_records: int = 5000) -> list[Message]:
        """Records that arrived (or were backlogged) since the last poll."""
        if self.missing:
            time.sleep(timeout_s)
            return []
        out: list[Message] = []
        for m in poll_batch(self.consumer, max_records, timeout_s):  # waits only while nothing is buffered
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self.errors.append(f"{self.topic}: {err.str()}")
                continue
            p, off = m.partition() or 0, m.offset() or 0
            if off < self._start.get(p, 0):  # fetched before the re-assignment took effect
                continue
            self._next[p] = off + 1
            if p in self._await_first:
                self._await_first.discard(p)
                self.covered_from_ms = max(self.covered_from_ms, m.timestamp()[1])
            out.append(m)
        return out

    @property
    def caught_up(self) -> bool:
        """Whether every record that was in the topic when the tail started has been read."""
        return self.missing or all(end is not None and self._next.get(p, 0) >= end for p, end in self._end.items())

    def close(self) -> None:
        self.consumer.close()


# --------------------------------------------------------------------------- what a frame shows
@dataclass(frozen=True)
class TierView:
    tier: str
    workers: int | None  # None: Redis unreachable, so the heartbeats (and this count) are unknown
    ready: int | None  # workers with their model loaded and partitions assigned
    models: str
    answers: int  # final answers in the window
    rate: float  # answers/s over the window
    p95_ms: float | None  # end-to-end, from the answers in the window
    worker_p95_ms: float | None  # the slowest live worker's own p95 (heartbeats)
    lag: int | None  # messages behind, summed over live workers; None: no heartbeat
    escalated: int
    degraded: int
    last_answer_s: float | None  # seconds since this tier's latest answer seen
    abstained: int = 0  # results of this stage over its out-of-scope threshold (light: escalated them)
    handovers: int = 0  # final answers handed over to a person (the customer got a holding message)
    written: int = 0  # final answers the writer wrote and the guard sent
    write_p95_ms: float | None = None  # the writer's time on the answers it was asked for (written or not)
    fallbacks: dict[str, int] = field(default_factory=dict)  # the template sent instead of the writer's reply, why


@dataclass(frozen=True)
class DeadLetter:
    at_ms: int
    kind: str
    stage: str
    reason: str


@dataclass(frozen=True)
class Frame:
    """Everything one status frame shows: pure data, rendered by `render()`."""

    at: float
    window_s: float
    tiers: list[TierView]
    thresholds: Thresholds | None
    dlq_rate: float
    dead_letters: list[DeadLetter]
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return sum(t.answers for t in self.tiers)

    @property
    def rate(self) -> float:
        return sum(t.rate for t in self.tiers)

    @property
    def heavy_share(self) -> float | None:
        heavy = next((t for t in self.tiers if t.tier == Tier.HEAVY.value), None)
        return heavy.answers / self.answers if heavy is not None and self.answers else None

    @property
    def handovers(self) -> int:
        return sum(t.handovers for t in self.tiers)

    @property
    def handover_share(self) -> float | None:
        """Share of all final answers handed over to a person (what `handover_budget` caps)."""
        return self.handovers / self.answers if self.answers else None


@dataclass(frozen=True, slots=True)
class _Answer:
    at_ms: int
    tier: str
    total_ms: float
    escalated: bool
    degraded: bool
    handover: bool
    write_ms: float = 0.0  # the writer's time (timings_ms.write); 0 where none wrote
    written: bool = False  # the writer's reply was sent
    fallback: str | None = None  # why the template was sent instead of the writer's reply


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class Status:
    """Collects the data of the view: tails of results and DLQ, heartbeats and thresholds from Redis."""

    def __init__(self, settings: Settings, window_s: float = WINDOW_S) -> None:
        self.s, self.window_s = settings, window_s
        t = topics_of(settings)
        self.results = TopicTail(settings, t.results, RESULTS_BACKLOG)
        self.dlq = TopicTail(settings, t.dlq, DLQ_BACKLOG)
        self.r = make_redis(settings)
        self._answers: deque[_Answer] = deque()
        self._abstained: deque[tuple[int, str]] = deque()  # (at ms, tier) of abstaining stage results
        self._last_answer: dict[str, int] = {}
        self._dlq_times: deque[int] = deque()
        self._dead: deque[DeadLetter] = deque(maxlen=LAST_DLQ)
        self.started = time.time()

    def start(self) -> Status:
        self.results.start()
        self.dlq.start()
        self.started = time.time()
        return self

    def close(self) -> None:
        self.results.close()
        self.dlq.close()
        self.r.close()

    def collect(self, seconds: float, stop: threading.Event | None = None, backlog: bool = False) -> None:
        """Read both tails for about `seconds` (less once `stop` is set); `backlog`: at most `seconds`, until what the
        topics held when the tails started is read."""
        deadline = time.monotonic() + seconds
        while stop is None or not stop.is_set():
            if backlog and self.results.caught_up and self.dlq.caught_up:
                break
            left = deadline - time.monotonic()
            for m in self.results.poll(min(0.2, max(0.0, left))):
                self._add_result(m)
            for m in self.dlq.poll(0.0, 500):
                self._add_dead(m)
            if time.monotonic() >= deadline:
                break

    def _add_result(self, m: Message) -> None:
        r = result_of(m.value())
        if r is None or r.get("shadow"):
            return
        at = int(r.get("answered_at") or m.timestamp()[1])
        tier = str(r.get("tier"))
        if r.get("abstained"):  # a light abstention is not final (it escalated): counted before the finals' filter
            self._abstained.append((at, tier))
        if not r.get("final"):
            return
        timings = r.get("timings_ms") or {}
        # As the SLO sees it: the writer's seconds apart (its own budget; pipeline/core/stats.py, Observed).
        write = float(timings.get("write", 0.0))
        total = max(0.0, float(timings.get("total", 0.0)) - write - float(timings.get("writer_wait", 0.0)))
        fallback = str(r.get("fallback_reason") or "unknown") if r.get("fallback") else None
        self._answers.append(_Answer(at, tier, total, bool(r.get("escalated")), bool(r.get("degraded")),
                                     bool(r.get("handover")), write, write > 0 and fallback is None, fallback))
        self._last_answer[tier] = max(at, self._last_answer.get(tier, 0))

    def _add_dead(self, m: Message) -> None:
        h = headers_dict(m)
        at = m.timestamp()[1]
        self._dlq_times.append(at)
        self._dead.append(DeadLetter(at, h.get("x-error-kind", "?"), h.get("x-stage", "?"),
                                     h.get("x-error", "")))

    def _window(self, now_ms: int) -> tuple[int, float]:
        """(start ms, length s) of the rate window: the last window_s, or less while data is short."""
        start = now_ms - int(self.window_s * 1000)
        start = max(start, self.results.covered_from_ms)
        return start, max(0.5, (now_ms - start) / 1000.0)

    def frame(self) -> Frame:
        now = time.time()
        now_ms = int(now * 1000)
        start_ms, window = self._window(now_ms)
        while self._answers and self._answers[0].at_ms < start_ms:
            self._answers.popleft()
        while self._abstained and self._abstained[0][0] < start_ms:
            self._abstained.popleft()
        while self._dlq_times and self._dlq_times[0] < now_ms - int(self.window_s * 1000):
            self._dlq_times.popleft()
        notes = [f"topic {tail.topic} does not exist: is the pipeline up? (tierflow topics create)"
                 for tail in (self.results, self.dlq) if tail.missing]
        notes += [*self.results.errors, *self.dlq.errors]
        beats: dict[str, list[HeartbeatDoc]] | None = None
        thresholds = None
        try:
            beats = {tier: read_heartbeats(self.r, self.s.redis.prefix, tier) for tier in _TIERS}
            raw = self.r.get(Keys(self.s.redis.prefix).thresholds)
            thresholds = Thresholds.model_validate_json(raw) if raw else None
            if raw is None:
                notes.append("no thresholds in Redis yet (ingest writes the defaults when it starts)")
        except (redis.RedisError, OSError) as e:
            beats = None  # not "0 workers": answers may well be flowing
            notes.append(f"Redis unreachable at {scrub(self.s.redis.address)}: worker counts, lag and thresholds "
                         f"unknown ({scrub(str(e)) or e.__class__.__name__})")
        except ValueError as e:
            notes.append(f"thresholds in Redis are invalid: {e}")
        tiers = [self._tier_view(t, None if beats is None else beats.get(t, []), start_ms, window, now_ms)
                 for t in _TIERS]
        return Frame(at=now, window_s=window, tiers=tiers, thresholds=thresholds,
                     dlq_rate=len(self._dlq_times) / self.window_s, dead_letters=list(self._dead)[::-1],
                     source=f"{self.s.kafka.servers}  {scrub(self.s.redis.address)}  topics {self.s.topic.prefix}*",
                     notes=notes)

    def _tier_view(self, tier: str, beats: list[HeartbeatDoc] | None, start_ms: int, window: float,
                   now_ms: int) -> TierView:
        # partitions interleave, so the deque is only roughly in time order: filter, don't trust the prune
        mine = [a for a in self._answers if a.tier == tier and a.at_ms >= start_ms]
        last = self._last_answer.get(tier)
        models = sorted({f"{b['model']}@{b['device']}" for b in beats or []})
        return TierView(
            tier=tier,
            workers=None if beats is None else len(beats),
            ready=None if beats is None else sum(1 for b in beats if b["ready"]),
            models=", ".join(models),
            answers=len(mine),
            rate=len(mine) / window,
            p95_ms=_p95([a.total_ms for a in mine]),
            worker_p95_ms=max((b["p95_ms"] for b in beats), default=None) if beats else None,
            lag=sum(b["lag"] for b in beats) if beats else None,
            escalated=sum(a.escalated for a in mine),
            degraded=sum(a.degraded for a in mine),
            last_answer_s=(now_ms - last) / 1000.0 if last else None,
            abstained=sum(1 for at, t in self._abstained if t == tier and at >= start_ms),
            handovers=sum(a.handover for a in mine),
            written=sum(a.written for a in mine),
            write_p95_ms=_p95([a.write_ms for a in mine if a.write_ms > 0]),
            fallbacks=dict(Counter(a.fallback for a in mine if a.fallback is not None)),
        )


# --------------------------------------------------------------------------- rendering
def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 1:
        return "now"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    return f"{seconds / 60:.0f}m ago" if seconds < 7200 else f"{seconds / 3600:.0f}h ago"


# Below this many columns the tier table drops the worker p95 and moves the models below it: the wide table's
# headers alone take ~120 columns, and the models' names ~40 more.
NARROW = 150


def _slo(th: Thresholds | None, tier: str) -> float | None:
    if th is None:
        return None
    return {Tier.LIGHT.value: th.light_slo_p95_ms, Tier.HEAVY.value: th.heavy_slo_p95_ms}.get(tier)


def _workers(t: TierView, narrow: bool) -> Text:
    if t.workers is None or t.ready is None:
        return Text("?", style="yellow")
    joining = t.workers - t.ready
    extra = (f" +{joining}" if narrow else f" ({joining} joining)") if joining else ""
    return Text(f"{t.ready if narrow and joining else t.workers}{extra}", style="" if t.ready else "red")


def _handed_over(t: TierView, narrow: bool) -> Text:
    """Hand-overs of a tier: the count, and in the wide table its share of the tier's answers."""
    share = f" ({t.handovers / t.answers:.0%})" if not narrow and t.answers and t.handovers else ""
    return Text(f"{t.handovers}{share}", style="yellow" if t.handovers else "")


def render(frame: Frame, width: int | None = None) -> RenderableType:
    """The frame as rich renderables: header, tier table, shares and rates, thresholds, dead letters.

    `width` (the terminal's columns): under NARROW, a layout that fits 80 columns (short headers, no worker p95,
    the models on a line of their own) instead of one whose every column rich would cut to "…".
    """
    th = frame.thresholds
    narrow = width is not None and width < NARROW
    header = Text.assemble(("tierflow status", "bold"), f"  {time.strftime('%H:%M:%S', time.localtime(frame.at))}"
                           f"  window {frame.window_s:.0f}s  ", (frame.source, "dim"))
    table = Table(box=box.SIMPLE_HEAD, expand=False, header_style="bold", pad_edge=False)
    columns = ((("tier", "left"), ("workers", "right"), ("ans/s", "right"), ("p95 ms", "right"), ("lag", "right"),
                ("esc", "right"), ("deg", "right"), ("abst", "right"), ("h/o", "right"), ("last", "right"))
               if narrow else
               (("tier", "left"), ("workers", "right"), ("answers/s", "right"), ("p95 ms", "right"),
                ("worker p95", "right"), ("lag", "right"), ("escalated", "right"), ("degraded", "right"),
                ("abstained", "right"), ("handed over", "right"), ("last answer", "right"), ("model", "left")))
    for name, justify in columns:
        # Every header whole: rich shrinks the widest columns first, and only the models may be cut ("…").
        flexible = name == "model"
        table.add_column(name, justify=justify, no_wrap=True,  # type: ignore[arg-type]
                         min_width=None if flexible else max(len(name), 10 if name == "tier" else 0),
                         overflow="ellipsis" if flexible else "fold")
    for t in frame.tiers:
        slo = _slo(th, t.tier)
        cells: list[str | Text] = [
            t.tier, _workers(t, narrow), f"{t.rate:.1f}",
            Text(_num(t.p95_ms), style="red" if slo and t.p95_ms and t.p95_ms > slo else ""),
            *([] if narrow else [_num(t.worker_p95_ms)]),
            _num(t.lag, "{:d}"), str(t.escalated),
            Text(str(t.degraded), style="yellow" if t.degraded else ""),
            str(t.abstained), _handed_over(t, narrow),
            _ago(t.last_answer_s).removesuffix(" ago") if narrow else _ago(t.last_answer_s),
            *([] if narrow else [Text(t.models or "-", style="dim")]),
        ]
        table.add_row(*cells)
    known = all(t.workers is not None for t in frame.tiers)
    total: list[str | Text] = [
        "all", str(sum(t.workers or 0 for t in frame.tiers)) if known else "?", f"{frame.rate:.1f}",
        _num(max((t.p95_ms for t in frame.tiers if t.p95_ms is not None), default=None)),
        *([] if narrow else [""]),
        _num(sum(t.lag or 0 for t in frame.tiers), "{:d}") if known else "?",
        str(sum(t.escalated for t in frame.tiers)), str(sum(t.degraded for t in frame.tiers)),
        str(sum(t.abstained for t in frame.tiers)), str(frame.handovers), "",
        *([] if narrow else [""]),
    ]
    table.add_row(*total, style="bold")
    models = (Text.assemble(("models ", "bold"), "  ".join(f"{t.tier} {t.models or '-'}" for t in frame.tiers),
                            style="dim") if narrow and any(t.models for t in frame.tiers) else None)

    share = frame.heavy_share
    budget = th.heavy_budget if th else None
    over = share is not None and budget is not None and share > budget
    answers = max(1, frame.answers)
    esc = sum(t.escalated for t in frame.tiers)
    deg = sum(t.degraded for t in frame.tiers)
    shares = Text.assemble(
        "heavy share ", (f"{share:.1%}" if share is not None else "-", "bold red" if over else "bold green"),
        f" of {frame.answers} answers" + (f" (budget {budget:.0%})" if budget is not None else ""),
        "   escalated ", f"{esc / answers:.1%}" if frame.answers else "-", f" ({esc / frame.window_s:.1f}/s)",
        "   degraded ", (f"{deg / answers:.1%}" if frame.answers else "-", "yellow" if deg else ""),
        f" ({deg / frame.window_s:.1f}/s)",
        "   dead letters ", (f"{frame.dlq_rate:.1f}/s", "yellow" if frame.dlq_rate else ""),
    )
    ho, ho_budget = frame.handover_share, th.handover_budget if th else None
    ho_over = ho is not None and ho_budget is not None and ho > ho_budget
    handed = Text.assemble(
        "handed over ", (f"{ho:.1%}" if ho is not None else "-", "bold red" if ho_over else "bold"),
        f" ({frame.handovers} answers" + (f"; budget {ho_budget:.0%})" if ho_budget is not None else ")"),
        "   abstained ", str(sum(t.abstained for t in frame.tiers)),
        f" ({sum(t.abstained for t in frame.tiers) / frame.window_s:.1f}/s)",
    )
    if th is not None:
        values = "  ".join(f"{k}={getattr(th, k):g}" for k in _THRESHOLD_KEYS)
        pins = f"  pinned: {', '.join(th.pinned)}" if th.pinned else ""
        thr = Text.assemble(("thresholds ", "bold"), (f"v{th.version}", "bold cyan"),
                            f" by {th.updated_by} ({th.reason})", pins, "\n  ", values)
    else:
        thr = Text("thresholds: -", style="dim")
    written = sum(t.written for t in frame.tiers)
    fallbacks: Counter[str] = Counter()
    for t in frame.tiers:
        fallbacks.update(t.fallbacks)
    write_p95 = max((t.write_p95_ms for t in frame.tiers if t.write_p95_ms is not None), default=None)
    writer = Text.assemble(
        ("writer ", "bold"), "wrote ", str(written),
        f" (p95 {write_p95 / 1000:.1f} s)" if write_p95 is not None else "",
        "   templates instead ", (str(sum(fallbacks.values())), "yellow" if fallbacks else ""),
        (": " + ", ".join(f"{k} {v}" for k, v in sorted(fallbacks.items()))) if fallbacks else "",
    ) if written or fallbacks else None
    parts: list[RenderableType] = [header, table, *([models] if models is not None else []), shares, handed,
                                   *([writer] if writer is not None else []), thr]
    if frame.dead_letters:
        dl = Table(box=box.SIMPLE_HEAD, title="last dead letters", title_justify="left", title_style="bold",
                   header_style="bold", show_edge=False, pad_edge=False)
        dl.add_column("at", no_wrap=True)
        dl.add_column("kind", no_wrap=True, style="yellow")
        dl.add_column("stage", no_wrap=True)
        if narrow:  # the reason wraps: cutting it, or squeezing the time and kind to "…", says nothing
            dl.add_column("reason", overflow="fold")
        else:
            dl.add_column("reason", overflow="ellipsis", no_wrap=True, max_width=70)
        for d in frame.dead_letters:
            dl.add_row(time.strftime("%H:%M:%S", time.localtime(d.at_ms / 1000)), d.kind, d.stage, d.reason)
        parts.append(dl)
    else:
        parts.append(Text("no dead letters", style="dim"))
    parts += [Text(f"! {n}", style="bold red") for n in frame.notes]
    return Group(*parts)


# --------------------------------------------------------------------------- command
def main(settings: Settings, once: bool = False, interval_s: float = 1.0, console: Console | None = None) -> int:
    """`tierflow status`: redraw every `interval_s` until Ctrl-C (then 130, the shell's convention); `once`: print
    one frame, of the last WINDOW_S as the topics hold it now, and return 0. Raises ServiceUnavailable when Kafka or
    Redis is unreachable."""
    # Ctrl-C sets `stop` from the start, so that it is honoured between steps and every consumer is closed:
    # a KeyboardInterrupt in the middle of librdkafka's start-up left its consumers to exit unclosed, and
    # that exit hung (measured: no exit 15 s after SIGINT on a loaded box). A second Ctrl-C interrupts at once.
    stop = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    status: Status | None = None
    try:
        check_reachable(settings.kafka.servers, "Kafka")
        check_reachable(settings.redis.address, "Redis")
        # Piped: 140 columns (the full table) unless COLUMNS says otherwise; a terminal: its own width.
        console = console or Console(file=sys.stdout,
                                     width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 140)
        status = Status(settings).start()
        if once:
            status.collect(ONCE_COLLECT_S, stop, backlog=True)  # the window is in the backlog: no waiting
            if stop.is_set():
                return 130
            console.print(render(status.frame(), console.width))
            return 0
        status.collect(0.5, stop)
        with Live(render(status.frame(), console.width), console=console, refresh_per_second=4,
                  transient=False) as live:
            while not stop.is_set():
                status.collect(max(0.1, interval_s), stop)
                live.update(render(status.frame(), console.width))
        return 130
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        if status is not None:
            status.close()

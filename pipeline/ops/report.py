"""`tierflow report`: a PNG and a text summary of a run, read back from the topics.

Reads `tierflow.results` (every model stage), `tierflow.labels` (ground truth, if any) and
`tierflow.dlq` from the beginning, each up to its end as of the read: the end is found by
partition-EOF events, which librdkafka derives from fetch watermarks (tansu's ListOffsets end
offsets are wrong, so no ListOffsets call is made). `--minutes` keeps records by their timestamp.

`summarize()` is the pure computation; `write_figure()` draws the 2x2 figure with matplotlib's
object API (no pyplot state, Agg canvas).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition

from pipeline.adapters.dlq import headers_dict
from pipeline.adapters.kafka import check_reachable, make_consumer, topics_of
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.records import Result, result_of
from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings

if TYPE_CHECKING:
    from matplotlib.axes import Axes

log = logging.getLogger(__name__)

TIER_COLORS: dict[str, str] = {"light": "#2ca02c", "heavy": "#d62728", "multimodal": "#1f77b4"}
_TIERS = [t.value for t in Tier]


# --------------------------------------------------------------------------- reading
def read_topic(settings: Settings, topic: str, since_ms: int | None = None, idle_s: float = 3.0,
               max_s: float = 600.0) -> Iterator[Message]:
    """Records of `topic` from the beginning to its end as of now (timestamp >= `since_ms` when given).

    Stops when every partition reported EOF; `idle_s` without records is a fallback for brokers that
    never report one. Reads through a group-less assignment, so nothing is committed anywhere.
    """
    consumer = make_consumer(settings, f"tierflow-report-{uuid.uuid4().hex[:8]}",
                             **{"enable.partition.eof": True})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            log.info("report: topic %s does not exist; nothing to read", topic)
            return
        pending = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        deadline = time.monotonic() + max_s
        last_record = time.monotonic()
        while pending and time.monotonic() < deadline:
            msgs = consumer.consume(2000, 0.2)
            if msgs:
                last_record = time.monotonic()
            elif time.monotonic() - last_record > idle_s:
                break
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                    else:
                        log.warning("report: %s: %s", topic, err)
                    continue
                ts_type, ts = m.timestamp()
                if since_ms is not None and ts_type != 0 and ts < since_ms:
                    continue
                yield m
    finally:
        consumer.close()


def _loads(msgs: Iterator[Message]) -> Iterator[dict[str, Any]]:
    for m in msgs:
        try:
            value = orjson.loads(m.value() or b"")
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            yield value


@dataclass
class RunData:
    """What a report is drawn from: result records, labels by request id, dead letters (ts ms, kind)."""

    results: list[Result] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    dlq: list[tuple[int, str]] = field(default_factory=list)


def read_run(settings: Settings, minutes: float | None = None) -> RunData:
    """Read results, labels and dead letters (the last `minutes` by record timestamp, or all)."""
    t = topics_of(settings)
    since = int((time.time() - minutes * 60) * 1000) if minutes else None
    data = RunData(results=[r for m in read_topic(settings, t.results, since) if (r := result_of(m.value()))])
    # Labels may arrive long after their answers: read them all, whatever the window.
    for lab in _loads(read_topic(settings, t.labels)):
        if lab.get("request_id") and lab.get("intent"):
            data.labels[str(lab["request_id"])] = str(lab["intent"])
    for m in read_topic(settings, t.dlq, since):
        _, ts = m.timestamp()
        data.dlq.append((ts, headers_dict(m).get("x-error-kind", "unknown")))
    return data


# --------------------------------------------------------------------------- summary
@dataclass(frozen=True)
class TierStats:
    """Final answers of one tier: count, end-to-end latency percentiles (ms), accuracy where labelled.

    Accuracy is of the answers a model gave: a hand-over (a holding message, then a person answers) is neither right
    nor wrong, so it is not in `labelled`; `handed_over` counts those with a label, `handed_over_matched` those of
    them whose nearest intent (what the model would have answered) was the label's.
    """

    answers: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    labelled: int = 0
    correct: int = 0
    handed_over: int = 0
    handed_over_matched: int = 0

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.labelled if self.labelled else None


@dataclass(frozen=True)
class Summary:
    """A run in numbers. Answers are final result records, one per request id (repeats are counted apart)."""

    results: int
    answers: int
    duplicates: int
    shadow: int
    tiers: dict[str, TierStats]
    overall: TierStats
    escalated: int
    degraded: int
    dlq: dict[str, int]
    first_ms: int | None = None
    last_ms: int | None = None
    heavy_budget: float | None = None
    handovers: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> reason -> final answers handed over
    abstained: dict[str, int] = field(default_factory=dict)  # tier -> stage results over its out-of-scope threshold
    handover_budget: float | None = None

    @property
    def handover_total(self) -> int:
        return sum(n for reasons in self.handovers.values() for n in reasons.values())

    @property
    def handover_share(self) -> float:
        return self.handover_total / self.answers if self.answers else 0.0

    @property
    def heavy_share(self) -> float:
        heavy = self.tiers.get(Tier.HEAVY.value)
        return heavy.answers / self.answers if heavy and self.answers else 0.0

    @property
    def escalation_rate(self) -> float:
        return self.escalated / self.answers if self.answers else 0.0

    @property
    def dlq_total(self) -> int:
        return sum(self.dlq.values())

    @property
    def duration_s(self) -> float:
        if self.first_ms is None or self.last_ms is None:
            return 0.0
        return (self.last_ms - self.first_ms) / 1000.0

    def text(self) -> str:
        """The report.txt body: a few lines a person reads in ten seconds."""
        lines = []
        if self.first_ms is not None and self.last_ms is not None:
            lines.append(f"tierflow report  {_clock(self.first_ms)} .. {_clock(self.last_ms)} UTC  "
                         f"({self.duration_s:.1f} s)")
        else:
            lines.append("tierflow report  (no answers)")
        lines.append(f"answers {self.answers}  (result records {self.results}, repeated answers dropped "
                     f"{self.duplicates}, shadow {self.shadow})")
        lines.append("")
        lines.append(f"{'tier':<11} {'answers':>8} {'share':>7} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9}  accuracy")
        for name in [*_TIERS, *sorted(set(self.tiers) - set(_TIERS))]:
            st = self.tiers.get(name)
            if st is not None:
                lines.append(self._row(name, st))
        lines.append(self._row("all", self.overall))
        lines.append("")
        budget = f" (budget {self.heavy_budget:.1%})" if self.heavy_budget is not None else ""
        over = "  OVER BUDGET" if self.heavy_budget is not None and self.heavy_share > self.heavy_budget else ""
        lines.append(f"heavy share {self.heavy_share:.1%}{budget}{over}")
        lines.append(f"escalated   {self.escalated} ({self.escalation_rate:.1%} of answers)")
        lines.append(f"degraded    {self.degraded}")
        lines.extend(self._out_of_scope())
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.dlq.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"dead letters {self.dlq_total}" + (f" ({kinds})" if kinds else ""))
        return "\n".join(lines) + "\n"

    def _out_of_scope(self) -> list[str]:
        """Abstentions per tier, hand-overs per tier and reason, and how accuracy counts the hand-overs."""
        order = [*_TIERS, *sorted((set(self.abstained) | set(self.handovers)) - set(_TIERS))]
        abst = ", ".join(f"{t} {self.abstained[t]}" for t in order if self.abstained.get(t))
        lines = [f"abstained   {sum(self.abstained.values())}" + (f" ({abst})" if abst else "")]
        budget = f"; budget {self.handover_budget:.1%}" if self.handover_budget is not None else ""
        over = "  OVER BUDGET" if self.handover_budget is not None and self.handover_share > self.handover_budget \
            else ""
        per = ", ".join(f"{t} {why} {n}" for t in order for why, n in sorted(self.handovers.get(t, {}).items()))
        lines.append(f"handed over {self.handover_total} ({self.handover_share:.1%} of answers{budget}){over}"
                     + (f": {per}" if per else ""))
        o = self.overall
        if self.handover_total:
            lines.append(f"            not in accuracy (a person answers them): {o.handed_over} labelled, the "
                         f"model's nearest intent was the label in {o.handed_over_matched}")
        return lines

    def _row(self, name: str, st: TierStats) -> str:
        share = st.answers / self.answers if self.answers else 0.0
        acc = f"{st.accuracy:.1%} (n={st.labelled})" if st.accuracy is not None else "-"
        return (f"{name:<11} {st.answers:>8} {share:>7.1%} {st.p50_ms:>9.1f} {st.p95_ms:>9.1f} "
                f"{st.p99_ms:>9.1f}  {acc}")


def _clock(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def answer_ms(r: Result) -> int:
    """When a result was answered (epoch ms): `answered_at`, else its produced timestamp."""
    stamps = r.get("timestamps")
    return int(r.get("answered_at") or (stamps.get("produced") if stamps else None) or 0)


def total_ms(r: Result) -> float:
    timings = r.get("timings_ms")
    return float(timings.get("total", 0.0) if timings else 0.0)


def final_answers(results: Sequence[Result]) -> tuple[list[Result], int]:
    """The final, non-shadow records, the first per request id, in answer order; and how many repeats."""
    seen: set[str] = set()
    out: list[Result] = []
    repeats = 0
    for r in results:
        if not r.get("final") or r.get("shadow"):
            continue
        rid = str(r.get("request_id"))
        if rid in seen:  # at-least-once delivery: a crash can re-answer a batch
            repeats += 1
            continue
        seen.add(rid)
        out.append(r)
    out.sort(key=answer_ms)
    return out, repeats


def label_of(r: Result, labels: Mapping[str, str]) -> str | None:
    """Ground truth for a result: the labels topic first, then the label the request carried."""
    lab = labels.get(str(r.get("request_id")))
    return lab if lab else (r.get("label") or None)


def _tier_stats(rows: Sequence[Result], labels: Mapping[str, str]) -> TierStats:
    lat = np.array([total_ms(r) for r in rows], dtype=float)
    p50, p95, p99 = (float(x) for x in np.percentile(lat, [50, 95, 99])) if len(lat) else (0.0, 0.0, 0.0)
    labelled = correct = handed = matched = 0
    for r in rows:
        lab = label_of(r, labels)
        if lab is None:
            continue
        right = int(r.get("intent") == lab)
        if r.get("handover"):  # a person answers: not the model's answer, right or wrong
            handed += 1
            matched += right
        else:
            labelled += 1
            correct += right
    return TierStats(len(rows), p50, p95, p99, labelled, correct, handed, matched)


def _abstained(results: Sequence[Result]) -> dict[str, int]:
    """Per tier, its stage results (not shadows) that abstained: once per request and stage."""
    seen: set[tuple[str, str]] = set()
    out: Counter[str] = Counter()
    for r in results:
        if not r.get("abstained") or r.get("shadow"):
            continue
        key = (str(r.get("request_id")), str(r.get("stage") or r.get("tier")))
        if key not in seen:
            seen.add(key)
            out[key[1]] += 1
    return dict(out)


def summarize(results: list[Result], labels: dict[str, str], dlq: Sequence[str] = (),
              heavy_budget: float | None = None, handover_budget: float | None = None) -> Summary:
    """The run's numbers from result records (schemas/result.v1.json), labels by request id and the
    dead letters' error kinds."""
    finals, repeats = final_answers(results)
    by_tier: dict[str, list[Result]] = defaultdict(list)
    handovers: dict[str, dict[str, int]] = defaultdict(dict)
    for r in finals:
        tier = str(r.get("tier"))
        by_tier[tier].append(r)
        if r.get("handover"):
            why = str(r.get("handover_reason") or "unknown")
            handovers[tier][why] = handovers[tier].get(why, 0) + 1
    return Summary(
        results=len(results),
        answers=len(finals),
        duplicates=repeats,
        shadow=sum(1 for r in results if r.get("shadow")),
        tiers={t: _tier_stats(rows, labels) for t, rows in by_tier.items()},
        overall=_tier_stats(finals, labels),
        escalated=sum(1 for r in finals if r.get("escalated")),
        degraded=sum(1 for r in finals if r.get("degraded")),
        dlq=dict(Counter(dlq)),
        first_ms=answer_ms(finals[0]) if finals else None,
        last_ms=answer_ms(finals[-1]) if finals else None,
        heavy_budget=heavy_budget,
        handovers=dict(handovers),
        abstained=_abstained(results),
        handover_budget=handover_budget,
    )


# --------------------------------------------------------------------------- figure
_NICE_WIDTHS_S = (0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)


def _windows(start_ms: int, end_ms: int, target: int, min_s: float = 0.1) -> tuple[float, int]:
    """(width s, count) of equal time windows covering [start, end]: about `target` of them, each at least
    `min_s` wide, the width rounded up to a round number of seconds (axes read "per 5 s", not "per 4.7 s")."""
    span_s = max(0.001, (end_ms - start_ms) / 1000.0)
    raw = max(min_s, span_s / target)
    width = next((float(w) for w in _NICE_WIDTHS_S if w >= raw), math.ceil(raw / 3600) * 3600.0)
    return width, max(1, math.ceil(span_s / width + 1e-9))


def _bin_index(ms: int, start_ms: int, width_s: float, n: int) -> int:
    return min(n - 1, max(0, int((ms - start_ms) / 1000.0 / width_s)))


def write_figure(summary: Summary, results: list[Result], labels: dict[str, str], path: Path,
                 dlq_times: Sequence[int] = ()) -> Path:
    """Draw the 2x2 report figure to `path` (PNG): latency per tier, traffic split over time, accuracy
    vs heavy share per window, escalation / degradation over time."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("tierflow report draws with matplotlib: pip install matplotlib") from None

    finals, _ = final_answers(results)
    fig = Figure(figsize=(14, 9.5), dpi=110, layout="constrained")
    title = "tierflow run report"
    if summary.first_ms is not None:
        title += f"  {_clock(summary.first_ms)} UTC, {summary.duration_s:.0f} s, {summary.answers} answers"
    fig.suptitle(title, fontsize=14, fontweight="bold")
    (ax_lat, ax_split), (ax_acc, ax_esc) = fig.subplots(2, 2)
    if not finals:
        for ax in (ax_lat, ax_split, ax_acc, ax_esc):
            _empty(ax, "no answers in this run")
    else:
        _plot_latency(ax_lat, finals, summary)
        _plot_split(ax_split, finals)
        _plot_accuracy(ax_acc, finals, labels, summary)
        _plot_escalation(ax_esc, finals, dlq_times)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _elapsed(finals: Sequence[Result]) -> tuple[int, float, str]:
    """(start ms, divisor, unit) for time axes: seconds for short runs, minutes for long ones."""
    start, end = answer_ms(finals[0]), answer_ms(finals[-1])
    return (start, 60.0, "min") if end - start > 20 * 60_000 else (start, 1.0, "s")


def _plot_latency(ax: Axes, finals: Sequence[Result], summary: Summary) -> None:
    lat = np.array([max(0.1, total_ms(r)) for r in finals])  # 0 ms answers still need a log-x bin
    lo, hi = float(lat.min()), float(lat.max())
    if hi <= lo * 1.5:
        lo, hi = lo / 2, hi * 2
    bins = [float(b) for b in np.logspace(math.log10(lo), math.log10(hi * 1.05), 40)]
    for tier in _TIERS:
        vals = [max(0.1, total_ms(r)) for r in finals if r.get("tier") == tier]
        if not vals:
            continue
        color = TIER_COLORS[tier]
        p95 = summary.tiers[tier].p95_ms
        ax.hist(vals, bins=bins, histtype="stepfilled", alpha=0.25, color=color)
        ax.hist(vals, bins=bins, histtype="step", linewidth=1.8, color=color,
                label=f"{tier} (n={len(vals)}, p95 {p95:.0f} ms)")
        ax.axvline(max(0.1, p95), color=color, linestyle="--", linewidth=1.2)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    # 1-2-5 ticks written as plain numbers: "200", not "2x10^2"
    narrow = hi / lo < 10  # less than a decade: more ticks, or the axis shows one or two numbers
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if narrow else (1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("end-to-end latency (ms, log scale; dashed: p95)")
    ax.set_ylabel("answers")
    ax.set_title("Latency per tier")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)


def _plot_split(ax: Axes, finals: Sequence[Result]) -> None:
    start, end = answer_ms(finals[0]), answer_ms(finals[-1])
    width, n = _windows(start, end, target=120)
    counts = {t: np.zeros(n) for t in _TIERS}
    for r in finals:
        tier = str(r.get("tier"))
        if tier in counts:
            counts[tier][_bin_index(answer_ms(r), start, width, n)] += 1
    _, div, unit = _elapsed(finals)
    edges = np.arange(n + 1) * width / div
    present = [t for t in _TIERS if counts[t].sum() > 0]
    # step="post" over the bin edges (last value repeated) draws each bin as a flat block
    ax.stackplot(edges, *[np.append(counts[t], counts[t][-1]) / width for t in present], labels=present,
                 colors=[TIER_COLORS[t] for t in present], alpha=0.8, step="post")
    ax.set_xlabel(f"time since first answer ({unit})")
    ax.set_ylabel(f"answers / s ({width:g} s bins)")
    ax.set_title("Traffic split over time")
    ax.set_xlim(0, n * width / div)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)


def _plot_accuracy(ax: Axes, finals: Sequence[Result], labels: Mapping[str, str],
                   summary: Summary) -> None:
    start, end = answer_ms(finals[0]), answer_ms(finals[-1])
    width, n = _windows(start, end, target=12)
    answered = np.zeros(n)
    heavy = np.zeros(n)
    labelled = np.zeros(n)
    correct = np.zeros(n)
    for r in finals:
        i = _bin_index(answer_ms(r), start, width, n)
        answered[i] += 1
        heavy[i] += r.get("tier") == Tier.HEAVY.value
        lab = label_of(r, labels)
        if lab is not None:
            labelled[i] += 1
            correct[i] += r.get("intent") == lab
    keep = labelled >= 3  # a window with one or two labels says nothing about accuracy
    if summary.heavy_budget is not None:
        ax.axvline(summary.heavy_budget * 100, color="0.3", linestyle=":", linewidth=1.5,
                   label=f"heavy budget {summary.heavy_budget:.0%}")
    if not keep.any():
        ax.text(0.5, 0.5, "no labelled answers\n(send requests with a label, or labels to tierflow.labels)",
                ha="center", va="center", transform=ax.transAxes, fontsize=11, color="0.4")
    else:
        share = heavy[keep] / answered[keep] * 100
        acc = correct[keep] / labelled[keep] * 100
        _, div, unit = _elapsed(finals)
        when = (np.arange(n)[keep] * width + width / 2) / div
        ax.plot(share, acc, color="0.6", linewidth=0.8, zorder=1)
        points = ax.scatter(share, acc, c=when, cmap="viridis", s=20 + 180 * labelled[keep] / labelled.max(),
                            edgecolors="black", linewidths=0.5, zorder=2)
        ax.figure.colorbar(points, ax=ax, label=f"window middle ({unit} since first answer)")
        overall = summary.overall.accuracy
        if overall is not None:
            ax.axhline(overall * 100, color="tab:purple", linestyle="--", linewidth=1,
                       label=f"overall accuracy {overall:.1%}")
    ax.set_xlim(-2, 102)
    low = float(np.min(correct[keep] / labelled[keep])) * 100 if keep.any() else 0.0
    ax.set_ylim(max(-2.0, min(low - 10, 50.0)), 102)  # zoomed in: accuracies differ by a few points
    ax.set_xlabel("share answered by heavy (%)")
    ax.set_ylabel("accuracy of labelled answers (%)")
    ax.set_title(f"Accuracy vs heavy share ({width:g} s windows; marker size: labels)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=9)


def _plot_escalation(ax: Axes, finals: Sequence[Result], dlq_times: Sequence[int]) -> None:
    start, end = answer_ms(finals[0]), answer_ms(finals[-1])
    width, n = _windows(start, end, target=40)
    answered, esc, deg, handed = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    for r in finals:
        i = _bin_index(answer_ms(r), start, width, n)
        answered[i] += 1
        esc[i] += bool(r.get("escalated"))
        deg[i] += bool(r.get("degraded"))
        handed[i] += bool(r.get("handover"))
    _, div, unit = _elapsed(finals)
    x = (np.arange(n) * width + width / 2) / div
    with np.errstate(invalid="ignore", divide="ignore"):
        esc_pct = np.where(answered > 0, esc / answered * 100, np.nan)
        deg_pct = np.where(answered > 0, deg / answered * 100, np.nan)
        handed_pct = np.where(answered > 0, handed / answered * 100, np.nan)
    ax.plot(x, esc_pct, color="tab:orange", marker="o", markersize=3, linewidth=1.8,
            label=f"escalated light -> heavy ({int(esc.sum())})")
    ax.plot(x, deg_pct, color="tab:purple", marker="s", markersize=3, linewidth=1.8,
            label=f"degraded heavy -> light ({int(deg.sum())})")
    if handed.any():
        ax.plot(x, handed_pct, color="tab:brown", marker="^", markersize=3, linewidth=1.8,
                label=f"handed over to a person ({int(handed.sum())})")
    ax.set_ylim(0, max(5.0, float(np.nanmax(np.concatenate([esc_pct, deg_pct, handed_pct, [0.0]]))) * 1.15))
    ax.set_xlabel(f"time since first answer ({unit})")
    ax.set_ylabel(f"% of answers ({width:g} s windows)")
    ax.set_xlim(0, n * width / div)
    ax.set_title("Escalation, degradation and hand-overs over time")
    ax.grid(True, alpha=0.3)
    artists, names = ax.get_legend_handles_labels()
    handles: list[Any] = list(artists)
    in_run = [t for t in dlq_times if start - width * 1000 <= t <= end + width * 1000]
    if in_run:
        dl = np.zeros(n)
        for t in in_run:
            dl[_bin_index(t, start, width, n)] += 1
        twin = ax.twinx()
        bars = twin.bar(x, dl, width=width / div * 0.8, color="0.5", alpha=0.35)
        twin.set_ylabel("dead letters per window")
        twin.set_ylim(0, max(1.0, float(dl.max())) * 2.5)  # keep the bars below the rate lines
        handles.append(bars)
        names.append(f"dead letters ({len(in_run)})")
    ax.legend(handles, names, loc="upper right", fontsize=9)


# --------------------------------------------------------------------------- command
def _budgets(settings: Settings) -> tuple[float | None, float | None]:
    """The current heavy and hand-over budgets from Redis, best effort: a report needs only Kafka."""
    import redis

    from pipeline.adapters.threshold_store import ThresholdStore
    from pipeline.core.thresholds import Thresholds
    from pipeline.errors import ServiceUnavailable

    try:
        check_reachable(settings.redis.address, "Redis", timeout=1.0)
        r = make_redis(settings)
        raw = r.get(ThresholdStore(r, settings.redis.prefix).key)
        if not raw:
            return None, None
        th = Thresholds.model_validate_json(raw)
        return th.heavy_budget, th.handover_budget
    except (ServiceUnavailable, redis.RedisError, OSError, ValueError):
        return None, None


def main(settings: Settings, out_dir: Path, minutes: float | None) -> int:
    """`tierflow report`: write report.png and report.txt under `out_dir`; print the summary."""
    check_reachable(settings.kafka.servers, "Kafka")
    data = read_run(settings, minutes)
    heavy_budget, handover_budget = _budgets(settings)
    summary = summarize(data.results, data.labels, [k for _, k in data.dlq], heavy_budget, handover_budget)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = write_figure(summary, data.results, data.labels, out_dir / "report.png", [t for t, _ in data.dlq])
    txt = out_dir / "report.txt"
    txt.write_text(summary.text(), encoding="utf-8")
    print(summary.text(), end="")
    if not summary.answers:
        print(f"\nno answers on {topics_of(settings).results}" + (f" in the last {minutes:g} min" if minutes else ""))
    print(f"\nwrote {png} and {txt}")
    return 0

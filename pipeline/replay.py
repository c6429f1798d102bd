"""Replay and backfill: recorded requests from a topic range or a file, through the backfill path.

Records go to `tierflow.replay`, which ingest and workers read only with the capacity live traffic
leaves free, so a backfill cannot starve live traffic. Each record carries headers: `x-replay-job`,
and optionally `x-pin-thresholds` (route under a fixed threshold version), `x-shadow` (run light and
heavy, answer nobody), `x-force` (answer again an id a replay already answered).

Progress is saved in Redis per job after every flushed chunk, so an interrupted replay resumes where
it stopped. Time ranges are resolved with `offsets_for_times` and then verified by reading record
timestamps; where the broker's answer is wrong (tansu always answers 0) a binary search by reading
finds the first record at or after the time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from pipeline.contracts import decode_request
from pipeline.dlq import error_headers
from pipeline.errors import ConfigError, InvalidMessage
from pipeline.kafka import Headers, make_consumer, make_producer, produce, topics_of
from pipeline.settings import Settings

log = logging.getLogger(__name__)

CHUNK = 500  # records between flush + progress save


# --------------------------------------------------------------------------- time and positions
def parse_when(text: str) -> int:
    """Epoch milliseconds from an integer (ms) or an ISO-8601 time (UTC when no zone is given)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"not a time: {text!r} (epoch ms or ISO-8601, e.g. 2026-11-30T10:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def parse_offsets(text: str) -> dict[int, int]:
    """'0:120,1:95' -> {0: 120, 1: 95}."""
    out: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        p, _, o = part.partition(":")
        if not (p.isdigit() and o.lstrip("-").isdigit()):
            raise ConfigError(f"offsets must look like 0:120,1:95 (got {text!r})")
        out[int(p)] = int(o)
    return out


class RandomReader:
    """Reads single records by (partition, offset): the tool behind verified time seeks."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.topic = topic
        self.c: Consumer = make_consumer(settings, f"tierflow-replay-seek-{time.time_ns()}",
                                         **{"enable.partition.eof": True})

    def read(self, partition: int, offset: int, timeout: float = 5.0) -> Message | None:
        """The record at `offset`, or None when the partition ends before it."""
        self.c.assign([TopicPartition(self.topic, partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.c.consume(1, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return None
                    continue
                return m
        return None

    def end(self, partition: int) -> int:
        """The partition's end offset, from a fetch response's watermark (ListOffsets is wrong on tansu)."""
        self.read(partition, 0, timeout=2.0)
        _, high = self.c.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
        return max(0, int(high or 0))

    def close(self) -> None:
        self.c.close()


def first_offset_at(reader: RandomReader, partition: int, ts_ms: int, guess: int | None) -> int:
    """The first offset whose timestamp is >= ts_ms: the broker's guess when verified, else a binary search."""

    def ts_at(off: int) -> int | None:
        m = reader.read(partition, off)
        return None if m is None else m.timestamp()[1]

    if guess is not None and guess >= 0:
        here = ts_at(guess)
        before = ts_at(guess - 1) if guess > 0 else None
        if here is not None and here >= ts_ms and (guess == 0 or (before is not None and before < ts_ms)):
            return guess
    lo, hi = 0, reader.end(partition)  # answer in [lo, hi]; hi means "no record at or after ts"
    while lo < hi:
        mid = (lo + hi) // 2
        t = ts_at(mid)
        if t is None or t >= ts_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo


# --------------------------------------------------------------------------- sources
@dataclass
class Source:
    """Where replayed records come from; `position` is what a resumed job restarts from."""

    name: str
    total: int | None = None

    def records(self, position: Any) -> Iterator[tuple[Any, bytes]]:
        raise NotImplementedError


@dataclass
class FileSource(Source):
    path: Path = Path()

    def __post_init__(self) -> None:
        if not self.path.exists():
            raise ConfigError(f"no such file: {self.path}")
        if self.path.suffix != ".parquet":
            with self.path.open("rb") as f:
                self.total = sum(1 for line in f if line.strip())

    def records(self, position: Any) -> Iterator[tuple[Any, bytes]]:
        """(next line index, record bytes) from JSONL, or Parquet rows as JSON (needs pyarrow)."""
        start = int(position or 0)
        if self.path.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ConfigError("reading Parquet needs pyarrow (pip install pyarrow)") from None
            rows = pq.read_table(self.path).to_pylist()
            self.total = len(rows)
            for i, row in enumerate(rows):
                if i >= start:
                    yield i + 1, orjson.dumps({k: v for k, v in row.items() if v is not None})
            return
        i = 0
        with self.path.open("rb") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                if i >= start:
                    yield i + 1, line
                i += 1


@dataclass
class TopicSource(Source):
    settings: Settings | None = None
    topic: str = ""
    start_ts: int | None = None
    end_ts: int | None = None
    start_offsets: dict[int, int] = field(default_factory=dict)
    end_offsets: dict[int, int] = field(default_factory=dict)

    def _bounds(self) -> tuple[dict[int, int], dict[int, int]]:
        assert self.settings is not None
        reader = RandomReader(self.settings, self.topic)
        try:
            md = reader.c.list_topics(self.topic, timeout=10)
            meta = md.topics.get(self.topic)
            if meta is None or meta.error is not None:
                raise ConfigError(f"no topic {self.topic!r} on {self.settings.bootstrap}")
            parts = sorted(meta.partitions)
            guesses: dict[int, int] = {}
            if self.start_ts is not None:
                found = reader.c.offsets_for_times([TopicPartition(self.topic, p, self.start_ts) for p in parts],
                                                   timeout=10)
                guesses = {tp.partition: tp.offset for tp in found}
            start, end = {}, {}
            for p in parts:
                hi = reader.end(p)
                if p in self.start_offsets:
                    start[p] = self.start_offsets[p]
                elif self.start_ts is not None:
                    start[p] = first_offset_at(reader, p, self.start_ts, guesses.get(p))
                else:
                    start[p] = 0
                if p in self.end_offsets:
                    end[p] = min(hi, self.end_offsets[p])
                elif self.end_ts is not None:
                    end[p] = first_offset_at(reader, p, self.end_ts + 1, None)
                else:
                    end[p] = hi
            return start, end
        finally:
            reader.close()

    def records(self, position: Any) -> Iterator[tuple[Any, bytes]]:
        """(per-partition next offsets, record bytes) for every record in range, partition by partition."""
        assert self.settings is not None
        start, end = self._bounds()
        if position:
            start.update({int(p): int(o) for p, o in position.items()})
        self.total = sum(max(0, end[p] - start[p]) for p in end)
        pos = {str(p): o for p, o in start.items()}
        todo = [p for p in end if start[p] < end[p]]
        if not todo:
            return
        c = make_consumer(self.settings, f"tierflow-replay-read-{time.time_ns()}", **{"enable.partition.eof": True})
        try:
            c.assign([TopicPartition(self.topic, p, start[p]) for p in todo])
            open_parts = set(todo)
            while open_parts:
                msgs = c.consume(1000, 1.0)
                for m in msgs:
                    err = m.error()
                    p = m.partition() or 0
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            open_parts.discard(p)
                        continue
                    off = m.offset() or 0
                    if p not in open_parts or off >= end[p]:
                        open_parts.discard(p)
                        continue
                    pos[str(p)] = off + 1
                    if off + 1 >= end[p]:
                        open_parts.discard(p)
                    yield dict(pos), m.value() or b""
        finally:
            c.close()


# --------------------------------------------------------------------------- the replay job
@dataclass
class ReplaySummary:
    job: str
    sent: int = 0
    skipped: int = 0
    invalid: int = 0
    labels: int = 0
    took_s: float = 0.0
    resumed_from: Any = None
    ids: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"replay {self.job}: sent {self.sent}, skipped {self.skipped} (already answered), "
                f"invalid {self.invalid} (to the DLQ), labels {self.labels}, took {self.took_s:.1f}s")


def job_name(source: Source, **opts: Any) -> str:
    """A stable job id for a source and its options: running the same command again resumes it."""
    digest = hashlib.sha1(json.dumps([source.name, opts], sort_keys=True, default=str).encode()).hexdigest()
    return f"job-{digest[:12]}"


class Replayer:
    """Sends a source's records to the backfill topic, rate-limited, resumable, idempotent by request id."""

    def __init__(self, settings: Settings, r: redis.Redis | None = None) -> None:
        self.s = settings
        self.topics = topics_of(settings)
        self.r = r or redis.Redis.from_url(settings.redis, socket_timeout=5, socket_connect_timeout=3)
        self.producer: Producer = make_producer(settings)
        self.answered_key = f"{settings.redis_prefix}replay:answered"
        self.source_name = "replay"

    def state_key(self, job: str) -> str:
        return f"{self.s.redis_prefix}replay:job:{job}"

    def run(self, source: Source, *, job: str, rate: float | None = None, limit: int | None = None,
            pin_thresholds: int | None = None, shadow: bool = False, force: bool = False, restart: bool = False,
            progress: bool = False, max_live_slowdown: float | None = 1.15) -> ReplaySummary:
        key = self.state_key(job)
        self.source_name = source.name
        raw_state: dict[bytes, bytes] = {} if restart else self.r.hgetall(key)  # type: ignore[assignment]
        state = {k.decode(): v.decode() for k, v in raw_state.items()}
        if state.get("done") == "1":
            log.info("replay %s already complete (use --restart to replay again)", job)
            return ReplaySummary(job, resumed_from="done")
        position = json.loads(state["position"]) if "position" in state else None
        summary = ReplaySummary(job, resumed_from=position)
        for k in ("sent", "skipped", "invalid", "labels"):
            setattr(summary, k, int(state.get(k, 0)))
        headers: Headers = [("x-replay-job", job.encode())]
        if pin_thresholds is not None:
            headers.append(("x-pin-thresholds", str(pin_thresholds).encode()))
        if shadow:
            headers.append(("x-shadow", b"1"))
        if force:
            headers.append(("x-force", b"1"))
        t0 = time.monotonic()
        guard = LiveGuard(self.r, self.s.redis_prefix, max_live_slowdown, rate) if max_live_slowdown else None
        pacer = Pacer(rate)
        chunk: list[tuple[Any, bytes]] = []
        bar = _Progress(progress, source)
        done_all = True
        for pos, raw in source.records(position):
            if limit is not None and summary.sent + summary.skipped + summary.invalid >= limit:
                done_all = False
                break
            chunk.append((pos, raw))
            if len(chunk) >= CHUNK:
                self._send_chunk(chunk, headers, summary, force or shadow, key)
                bar.advance(len(chunk), summary)
                chunk = []
            if guard is not None:
                pacer.rate = guard.rate()
            pacer.wait()
        if chunk:
            self._send_chunk(chunk, headers, summary, force or shadow, key)
            bar.advance(len(chunk), summary)
        bar.close()
        if done_all:
            self.r.hset(key, "done", "1")
        summary.took_s = time.monotonic() - t0
        return summary

    def _send_chunk(self, chunk: list[tuple[Any, bytes]], headers: Headers, summary: ReplaySummary,
                    force: bool, key: str) -> None:
        parsed: list[tuple[bytes, Any]] = []
        for pos, raw in chunk:
            try:
                parsed.append((raw, decode_request(raw, self.s.max_message_bytes)))
            except InvalidMessage as e:
                self._dead(raw, e, self.source_name, pos)
                summary.invalid += 1
        answered = self._answered([req.id for _, req in parsed]) if not force else set()
        for raw, req in parsed:
            if req.id in answered:
                summary.skipped += 1
                continue
            produce(self.producer, self.topics.replay, raw, key=(req.user_id or req.id), headers=headers)
            summary.sent += 1
            if len(summary.ids) < 1_000_000:
                summary.ids.append(req.id)
            if req.label:
                produce(self.producer, self.topics.labels,
                        orjson.dumps({"request_id": req.id, "intent": req.label, "ts": int(time.time() * 1000)}),
                        key=req.id)
                summary.labels += 1
        if self.producer.flush(self.s.flush_timeout_s):
            raise ConfigError("the broker did not acknowledge the replayed records; progress not saved")
        # Saved only after the flush: a resumed job may resend a chunk, never skip one.
        self.r.hset(key, mapping={"position": json.dumps(chunk[-1][0]), "sent": summary.sent,
                                  "skipped": summary.skipped, "invalid": summary.invalid, "labels": summary.labels,
                                  "updated": time.time()})

    def _answered(self, ids: list[str]) -> set[str]:
        if not ids:
            return set()
        flags = self.r.smismember(self.answered_key, ids)
        return {i for i, f in zip(ids, flags, strict=True) if f}

    def _dead(self, raw: bytes, e: InvalidMessage, source: str, position: Any) -> None:
        offset = position if isinstance(position, int) else -1
        produce(self.producer, self.topics.dlq, raw,
                headers=error_headers(e.kind, e.reason, "replay", source, -1, offset))


class Pacer:
    """Spaces records 1/rate apart (None: no limit); the rate may change between records."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._next = time.monotonic()

    def wait(self) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        if self._next > now:
            time.sleep(self._next - now)
        self._next = max(self._next, now - 0.05) + 1.0 / self.rate  # little credit for idle time: no bursts


class LiveGuard:
    """Backs off a replay when live answers get slower: the backfill yields to live traffic.

    The workers' heartbeats carry the p95 of their live answers (replays excluded). The guard takes a
    baseline per tier before the replay starts, then every `interval_s` halves its rate when any tier's
    live p95 is over `max_slowdown` times its baseline, and otherwise grows it additively (AIMD, as TCP
    does with a congested link), never above the operator's `--rate`.
    """

    def __init__(self, r: redis.Redis, prefix: str, max_slowdown: float, max_rate: float | None,
                 interval_s: float = 0.5, start_rate: float = 500.0, slack_ms: float = 10.0,
                 min_rate: float = 100.0) -> None:
        self.r, self.prefix, self.max_slowdown = r, prefix, max_slowdown
        self.interval_s, self.slack_ms, self.min_rate = interval_s, slack_ms, min_rate
        self.max_rate = max_rate or 20_000.0
        self.current = min(start_rate, self.max_rate)
        self.baseline = self._p95s()
        self._checked = time.monotonic()

    def _p95s(self) -> dict[str, float]:
        from pipeline.heartbeats import read_heartbeats

        out: dict[str, float] = {}
        try:
            for tier in ("light", "heavy", "multimodal"):
                beats = [b for b in read_heartbeats(self.r, self.prefix, tier) if b.get("live_p95_ms")]
                if beats:
                    out[tier] = max(float(b["live_p95_ms"]) for b in beats)
        except (redis.RedisError, OSError):
            pass
        return out

    def rate(self) -> float:
        now = time.monotonic()
        if now - self._checked < self.interval_s:
            return self.current
        self._checked = now
        p95 = self._p95s()
        # slower than both the ratio and a few ms of slack: p95 of a few ms jitters by more than 15%
        slow = any(p95[t] > max(self.baseline[t] * self.max_slowdown, self.baseline[t] + self.slack_ms)
                   for t in p95 if t in self.baseline)
        if slow:
            self.current = max(self.min_rate, self.current / 2)
        else:
            self.current = min(self.max_rate, self.current + max(50.0, self.current * 0.1))
        return self.current


class _Progress:
    """A rich progress bar with ETA (or nothing, when not on a terminal)."""

    def __init__(self, enabled: bool, source: Source) -> None:
        self.p: Any = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.p = Progress(TextColumn("replay"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                              TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.p.start()
            self.task = self.p.add_task("replay", total=source.total, info="")
        self.source = source

    def advance(self, n: int, s: ReplaySummary) -> None:
        if self.p is not None:
            self.p.update(self.task, advance=n, total=self.source.total,
                          info=f"sent {s.sent} skipped {s.skipped} invalid {s.invalid}")

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()


def wait_for_results(settings: Settings, ids: set[str], timeout_s: float, shadow: bool) -> list[dict[str, Any]]:
    """The results of a replay's requests (final ones, or both shadow stages), read from tierflow.results."""
    c = make_consumer(settings, f"tierflow-replay-wait-{time.time_ns()}")
    c.subscribe([topics_of(settings).results])
    want = len(ids) * (2 if shadow else 1)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    seen: set[tuple[str, str]] = set()
    try:
        while len(seen) < want and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is not None or m.value() is None:
                    continue
                res = orjson.loads(m.value() or b"{}")
                rid = res.get("request_id")
                if rid not in ids or not res.get("replay"):
                    continue
                if (res.get("shadow") if shadow else res.get("final")):
                    k = (rid, res.get("stage", ""))
                    if k not in seen:
                        seen.add(k)
                        out.append(res)
    finally:
        c.close()
    return out


def accuracy_table(results: list[dict[str, Any]]) -> str:
    """Accuracy per tier (or per stage for shadow results) where a label exists."""
    total: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for res in results:
        if res.get("label"):
            k = res["stage"]
            total[k] += 1
            right[k] += res["intent"] == res["label"]
    lines = [f"{'tier':<12}{'labelled':>10}{'accuracy':>10}"]
    for k in sorted(total):
        lines.append(f"{k:<12}{total[k]:>10}{right[k] / total[k]:>10.1%}")
    if total:
        lines.append(f"{'all':<12}{sum(total.values()):>10}{sum(right.values()) / sum(total.values()):>10.1%}")
    return "\n".join(lines)

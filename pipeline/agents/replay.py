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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from pipeline.adapters.control_cache import ControlCache
from pipeline.adapters.dlq import DeadLetters, error_headers
from pipeline.adapters.heartbeats import RECENT_S, read_heartbeats
from pipeline.adapters.kafka import (
    Headers,
    make_consumer,
    make_producer,
    produce,
    topics_of,
)
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import ControlKeys, Keys
from pipeline.contracts.models import decode_request
from pipeline.core.control import replay_progress
from pipeline.core.pacing import CHUNK, LiveGuard, Pacer, TierLatency
from pipeline.errors import ConfigError, InvalidMessage, ServiceUnavailable
from pipeline.settings import Settings

log = logging.getLogger(__name__)



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
        # One record is wanted per read: small fetches and no prefetch, else a seek waits out the fetch queue's
        # backoff (1 s by default; a time search went from ~10 s to ~0.5 s).
        self.c: Consumer = make_consumer(settings, f"tierflow-replay-seek-{time.time_ns()}",
                                         **{"enable.partition.eof": True, "queued.min.messages": 1,
                                            "fetch.queue.backoff.ms": 1, "fetch.message.max.bytes": 65536,
                                            "max.partition.fetch.bytes": 65536})

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


def first_offset_at(reader: RandomReader, partition: int, ts_ms: int, guess: int | None, lo: int = 0,
                    hi: int | None = None) -> int:
    """The first offset in [lo, hi] whose timestamp is >= ts_ms (hi: none is): the broker's guess when verified,
    else a search by reading.

    The search interpolates on timestamps every other step and bisects in between: a few reads where
    timestamps grow evenly with offsets, never more than twice a binary search's. Each read is a fetch
    the broker serves beside live traffic, so fewer reads is a quieter start.
    """

    def ts_at(off: int) -> int | None:
        m = reader.read(partition, off)
        return None if m is None else m.timestamp()[1]

    if guess is not None and guess >= 0:
        here = ts_at(guess)
        before = ts_at(guess - 1) if guess > 0 else None
        if here is not None and here >= ts_ms and (guess == 0 or (before is not None and before < ts_ms)):
            return guess
    if hi is None:
        hi = reader.end(partition)
    below: tuple[int, int] | None = None  # (offset, timestamp) of a record known to be before ts_ms
    above: tuple[int, int] | None = None  # ... and of one known to be at or after it
    step = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if step % 2 == 0:
            if below is None or above is None:  # the bracket's ends, to interpolate between
                mid = lo if below is None else hi - 1
            elif above[1] > below[1]:
                frac = (ts_ms - below[1]) / (above[1] - below[1])
                mid = min(hi - 1, max(lo, below[0] + 1 + int(frac * (above[0] - below[0] - 1))))
        step += 1
        t = ts_at(mid)
        if t is None or t >= ts_ms:
            hi = mid
            if t is not None:
                above = (mid, t)
        else:
            lo = mid + 1
            below = (mid, t)
    return lo


# --------------------------------------------------------------------------- sources
@dataclass
class Source:
    """Where replayed records come from; `position` is what a resumed job restarts from."""

    name: str
    total: int | None = None

    def records(self, position: Any) -> Iterator[tuple[Any, bytes, int | None]]:
        """(position after the record, its bytes, when it was first sent in ms, None where unknown)."""
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

    def records(self, position: Any) -> Iterator[tuple[Any, bytes, int | None]]:
        """(next line index, record bytes, None) from JSONL, or Parquet rows as JSON (needs pyarrow); a row's
        own `ts` says when it was sent."""
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
                    yield i + 1, orjson.dumps({k: v for k, v in row.items() if v is not None}), None
            return
        i = 0
        with self.path.open("rb") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                if i >= start:
                    yield i + 1, line, None
                i += 1


@dataclass
class TopicSource(Source):
    settings: Settings | None = None
    topic: str = ""
    start_ts: int | None = None
    end_ts: int | None = None
    start_offsets: dict[int, int] = field(default_factory=dict)
    end_offsets: dict[int, int] = field(default_factory=dict)

    def _bounds(self) -> tuple[dict[int, int], dict[int, int | None]]:
        """Per partition, the first offset to replay, and the offset to stop before (None: at the first record
        after `end_ts`, found by reading the range itself rather than by a search beforehand)."""
        assert self.settings is not None
        reader = RandomReader(self.settings, self.topic)
        try:
            md = reader.c.list_topics(self.topic, timeout=10)
            meta = md.topics.get(self.topic)
            if meta is None or meta.error is not None:
                raise ConfigError(f"no topic {self.topic!r} on {self.settings.kafka.servers}")
            parts = sorted(meta.partitions)
            guesses: dict[int, int] = {}
            if self.start_ts is not None:
                found = reader.c.offsets_for_times([TopicPartition(self.topic, p, self.start_ts) for p in parts],
                                                   timeout=10)
                guesses = {tp.partition: tp.offset for tp in found}
            start: dict[int, int] = {}
            end: dict[int, int | None] = {}
            for p in parts:
                if p in self.start_offsets:
                    start[p] = self.start_offsets[p]
                elif self.start_ts is not None:
                    start[p] = first_offset_at(reader, p, self.start_ts, guesses.get(p))
                else:
                    start[p] = 0
                if p in self.end_offsets:
                    end[p] = min(reader.end(p), self.end_offsets[p])
                elif self.end_ts is not None:
                    end[p] = None
                else:
                    end[p] = reader.end(p)
            return start, end
        finally:
            reader.close()

    def records(self, position: Any) -> Iterator[tuple[Any, bytes, int | None]]:
        """(per-partition next offsets, record bytes) for every record in range, partition by partition.

        A partition's range ends at its end offset, or with `end_ts` at its first record after that time
        (or at its end, where none is).
        """
        assert self.settings is not None
        t0 = time.monotonic()
        start, end = self._bounds()
        log.info("replay: %s from offsets %s in %.1fs", self.topic, start, time.monotonic() - t0)
        if position:
            start.update({int(p): int(o) for p, o in position.items()})
        ends = [(p, e) for p, e in end.items() if e is not None]
        self.total = sum(max(0, e - start[p]) for p, e in ends) if len(ends) == len(end) else None
        pos = {str(p): o for p, o in start.items()}
        todo = [p for p, e in end.items() if e is None or start[p] < e]
        if not todo:
            return
        # Prefetch no further than what the paced replay takes next: a reader that keeps fetching (up to the
        # topic's live end) is broker load that live traffic pays for. Partitions pause once read to their end.
        c = make_consumer(self.settings, f"tierflow-replay-read-{time.time_ns()}",
                          **{"enable.partition.eof": True, "queued.min.messages": CHUNK,
                             "fetch.queue.backoff.ms": 100, "fetch.message.max.bytes": 1 << 20,
                             "max.partition.fetch.bytes": 1 << 20})
        try:
            c.assign([TopicPartition(self.topic, p, start[p]) for p in todo])
            open_parts = set(todo)

            def close(p: int) -> None:
                open_parts.discard(p)
                c.pause([TopicPartition(self.topic, p)])

            while open_parts:
                msgs = c.consume(CHUNK, 1.0)
                for m in msgs:
                    err = m.error()
                    p = m.partition() or 0
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF and p in open_parts:
                            close(p)
                        continue
                    if p not in open_parts:
                        continue
                    off, stop = m.offset() or 0, end[p]
                    if off >= stop if stop is not None else m.timestamp()[1] > (self.end_ts or 0):
                        close(p)
                        continue
                    pos[str(p)] = off + 1
                    if stop is not None and off + 1 >= stop:
                        close(p)
                    ts_type, ts = m.timestamp()
                    yield dict(pos), m.value() or b"", ts if ts_type != 0 and ts > 0 else None
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
        self.r = r or make_redis(settings, command=True)
        self.producer: Producer = make_producer(settings)
        self.dlq = DeadLetters(settings, "replay")
        self.answered_key = Keys(settings.redis.prefix).replay_answered
        self.source_name = "replay"

    def state_key(self, job: str) -> str:
        return Keys(self.s.redis.prefix).replay_job(job)

    def run(self, source: Source, *, job: str, rate: float | None = None, limit: int | None = None,
            pin_thresholds: int | None = None, shadow: bool = False, force: bool = False, restart: bool = False,
            progress: bool = False, max_live_slowdown: float | None = 1.15) -> ReplaySummary:
        key = self.state_key(job)
        self.source_name = source.name
        # A Redis that lost its state (restarted, flushed) gets it back from the control topic first: where this
        # job got to, and which ids replays answered
        ControlCache.of(self.s, self.r).ensure_restored()
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
        guard = None
        if max_live_slowdown:
            guard = LiveGuard(lambda: read_live_latency(self.r, self.s.redis.prefix), max_live_slowdown, rate,
                              min_rate=self.s.replay.min_rate, horizon_s=RECENT_S)
            log.info("replay %s: live p95 baseline %s ms", job, {t: round(v) for t, v in guard.baseline.items()})
        pacer = Pacer(guard.rate() if guard is not None else rate)
        chunk: list[tuple[Any, bytes, int | None]] = []
        bar = _Progress(progress, source)
        done_all = True
        for pos, raw, sent_ms in source.records(position):
            if limit is not None and summary.sent + summary.skipped + summary.invalid >= limit:
                done_all = False
                break
            chunk.append((pos, raw, sent_ms))
            if len(chunk) >= pacer.chunk_size():
                self._send_chunk(chunk, headers, summary, force or shadow, job)
                bar.advance(len(chunk), summary)
                if guard is not None:
                    pacer.rate = guard.wait_rate()
                pacer.wait(len(chunk))
                chunk = []
        if chunk:
            self._send_chunk(chunk, headers, summary, force or shadow, job)
            bar.advance(len(chunk), summary)
        bar.close()
        if done_all:
            saved: dict[bytes, bytes] = self.r.hgetall(key)  # type: ignore[assignment]
            self._save(job, {**{k.decode(): v.decode() for k, v in saved.items()}, "done": "1"})
        summary.took_s = time.monotonic() - t0
        return summary

    def _send_chunk(self, chunk: list[tuple[Any, bytes, int | None]], headers: Headers, summary: ReplaySummary,
                    force: bool, job: str) -> None:
        parsed: list[tuple[Any, bytes, Any, int | None]] = []
        for pos, raw, sent_ms in chunk:
            try:
                parsed.append((pos, raw, decode_request(raw, self.s.max_message_bytes), sent_ms))
            except InvalidMessage as e:
                self._dead(raw, e, self.source_name, pos)
                summary.invalid += 1
        answered = self._answered([req.id for _, _, req, _ in parsed]) if not force else set()
        for pos, raw, req, sent_ms in parsed:
            if req.id in answered:
                summary.skipped += 1
                continue
            # When it was first sent: ingest places it in its customer's conversation as of then (idle gaps kept).
            hs = headers if sent_ms is None else [*headers, ("x-sent-ms", str(sent_ms).encode())]
            try:
                produce(self.producer, self.topics.replay, raw, key=(req.user_id or req.id), headers=hs)
            except InvalidMessage as e:  # fits its source, not with the replay headers: dead-letter, go on
                self._dead(raw, e, self.source_name, pos)
                summary.invalid += 1
                continue
            summary.sent += 1
            if len(summary.ids) < 1_000_000:
                summary.ids.append(req.id)
            if req.label:
                produce(self.producer, self.topics.labels,
                        orjson.dumps({"request_id": req.id, "intent": req.label, "ts": int(time.time() * 1000)}),
                        key=req.id)
                summary.labels += 1
        # The progress is saved once the chunk is acknowledged: a resumed job may resend a chunk, never skip one.
        self._save(job, self._progress(chunk[-1][0], summary))

    @staticmethod
    def _progress(position: Any, summary: ReplaySummary) -> dict[str, str]:
        return {"position": json.dumps(position), "sent": str(summary.sent), "skipped": str(summary.skipped),
                "invalid": str(summary.invalid), "labels": str(summary.labels), "updated": f"{time.time():.3f}"}

    def _save(self, job: str, progress: dict[str, str]) -> None:
        """A job's progress, once the broker has acknowledged everything sent before it: to the control topic, then
        to Redis. Records and progress in one flush would not do: they go to different partitions, so a kill during
        the flush can leave the progress delivered and part of its chunk not (a CI run's resumed replay on tansu,
        its Redis flushed, skipped 20 ids it had never sent)."""
        if self.producer.flush(self.s.flush_timeout_s) or not self.dlq.flush(self.s.flush_timeout_s):
            raise ServiceUnavailable("the broker did not acknowledge the replayed records; progress not saved")
        produce(self.producer, self.topics.control, replay_progress(progress), key=ControlKeys.replay_job(job))
        if self.producer.flush(self.s.flush_timeout_s):
            raise ServiceUnavailable("the broker did not acknowledge the replay's progress; progress not saved")
        self.r.hset(self.state_key(job), mapping=progress)  # type: ignore[arg-type]

    def _answered(self, ids: list[str]) -> set[str]:
        if not ids:
            return set()
        flags = self.r.smismember(self.answered_key, ids)
        return {i for i, f in zip(ids, flags, strict=True) if f}

    def _dead(self, raw: bytes, e: InvalidMessage, source: str, position: Any) -> None:
        offset = position if isinstance(position, int) else -1
        self.dlq.send_raw(raw, error_headers(e.kind, e.reason, "replay", source, -1, offset))


def read_live_latency(r: redis.Redis, prefix: str) -> tuple[TierLatency, float]:
    """Per tier, the slowest worker's live latency from the heartbeats; and the newest heartbeat's time (nothing,
    time 0, while Redis cannot be read: the guard then holds its rate)."""
    out: TierLatency = {}
    newest = 0.0
    for tier in ("light", "heavy", "multimodal"):
        try:
            beats = read_heartbeats(r, prefix, tier)
        except (redis.RedisError, OSError):
            return {}, 0.0
        if not beats:
            continue
        newest = max([newest, *(b["ts"] for b in beats)])
        out[tier] = (max(b["live_recent_p95_ms"] for b in beats), min(b["live_recent_n"] for b in beats))
    return out, newest


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

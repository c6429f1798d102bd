"""Kafka clients with tierflow's defaults, topic creation, and the at-least-once bookkeeping helpers.

Defaults that matter: offsets are committed explicitly after outputs are flushed (never auto);
short session/heartbeat/fetch-wait times so group joins and fetches are fast (on tansu the librdkafka
defaults make a join take 20+ s and triple latency).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlparse

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from pipeline import metrics
from pipeline.adapters.brokers import answers_fetches_at_once, counts_batches, shows_out_of_order
from pipeline.contracts.topics import Topics, TopicSpec, topic_specs
from pipeline.core.fetch_pacing import FetchPacer, behind_ends
from pipeline.core.ordering import GapGuard
from pipeline.errors import InvalidMessage, ServiceUnavailable
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def topics_of(settings: Settings) -> Topics:
    return Topics(settings.topic.prefix)


def specs_of(settings: Settings) -> list[TopicSpec]:
    return topic_specs(topics_of(settings), settings.partitions, settings.replication_factor,
                       settings.max_message_bytes, settings.topic.retention_ms, settings.topic.retention_bytes)


@dataclass
class DeliveryTracker:
    """Counts delivery reports so a loop knows whether everything it produced was accepted."""

    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"{msg.topic()}: {err.str()}")
            metrics.DELIVERY_FAILED.labels(msg.topic() or "?").inc()

    def reset(self) -> None:
        self.failed = 0
        self.errors.clear()


def make_output_producer(settings: Settings, **overrides: Any) -> Producer:
    """A producer of topics other programs read (answers, results, the DLQ): `kafka_output_compression`, a codec
    every mainstream client reads without plugins (kafkajs has no lz4); the topics only tierflow reads keep
    `kafka_compression` (make_producer)."""
    return make_producer(settings, **{"compression.type": settings.kafka.output_compression, **overrides})


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    """A producer with tierflow's defaults, for topics only tierflow reads."""
    conf = settings.kafka_config()
    conf.update({
        "linger.ms": 2,
        "acks": "all",
        "message.max.bytes": producer_limit(settings.max_message_bytes),
        "queue.buffering.max.messages": 1_000_000,
        "batch.num.messages": 10_000,
        "compression.type": settings.kafka.compression,
    })
    conf.update(overrides)
    return Producer(conf)


RECEIVE_MAX_BYTES = 1_000_000_000  # librdkafka's receive.message.max.bytes ceiling is 2^31 - 1


def make_member(settings: Settings, group: str, rest_max_ms: float | None = None,
                **overrides: Any) -> OrderedConsumer:
    """A consumer for a long-lived member of `group` (ingest, workers, their backfill lanes): with a stable
    process identity (`worker_id`) it rejoins as itself after a restart (static membership, KIP-345): no
    rebalance wait, and on the embedded noida, which never expires a member that stopped heartbeating, the
    only way a restarted member gets its partitions back at all (measured: none within 600 s)."""
    if settings.worker_id:
        overrides = {"group.instance.id": f"{group}-{settings.worker_id}", **overrides}
    return make_consumer(settings, group, rest_max_ms, **overrides)


def make_consumer(settings: Settings, group: str, rest_max_ms: float | None = None,
                  **overrides: Any) -> OrderedConsumer:
    """A consumer with tierflow's defaults. `rest_max_ms`: the longest an idle consumer waits between looks at the
    log's end, on a broker that does not hold fetches (default `TIERFLOW_KAFKA_REST_MAX_MS`; backfill lanes wait
    longer)."""
    k = settings.kafka
    pacing = None if k.fetch_pacing == "auto" else k.fetch_pacing == "on"
    pacer = FetchPacer(rest_after_s=k.rest_after_ms / 1000.0, sparse_rest_s=k.sparse_rest_ms / 1000.0,
                       max_s=(k.rest_max_ms if rest_max_ms is None else rest_max_ms) / 1000.0)
    # Transactions leave a gap at every commit marker: guarded, each would cost a reader GAP_GRACE_S.
    return OrderedConsumer(consumer_config(settings, group, **overrides), guard=not settings.exactly_once,
                           pacing=pacing, pacer=pacer)


def consumer_config(settings: Settings, group: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings of tierflow's consumers."""
    conf = settings.kafka_config()
    conf.update({
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "fetch.wait.max.ms": 25,
        "fetch.message.max.bytes": settings.max_message_bytes,
        "max.partition.fetch.bytes": settings.max_message_bytes,
        # The most one fetch response may be. Kafka keeps a response under fetch.max.bytes (50 MB), but the
        # embedded noida answers with everything up to the end of every partition asked for: with the
        # default (100 MB) a consumer that far behind fails every fetch and never catches up.
        "receive.message.max.bytes": RECEIVE_MAX_BYTES,
    })
    conf.update(overrides)
    return conf


class Bell(Protocol):
    """What wakes a resting consumer before its next look (pipeline/adapters/doorbell.py)."""

    event: threading.Event

    def close(self) -> None: ...


LOOK_S = 0.005  # how long a resting consumer's periodic look waits for a fetch (noida answers in well under 1 ms)


class OrderedConsumer(Consumer):
    """A consumer that never skips a record a broker showed late, and rests while idle on a broker that answers
    every fetch at once.

    Ordering (pipeline/core/ordering.py): on a broker that can show a partition's records out of offset order
    (`shows_out_of_order`: tierflow's tansu, known by its cluster id), each record goes through a `GapGuard`; one
    it holds back is dropped from what this call returns, with the rest of its partition in hand, and the
    partition is read again from the offset expected. Elsewhere, and with `guard=False`, records pass as they
    come: a transaction's commit marker leaves such a gap, and must not cost a wait (measured on tansu: 5
    transactions read in 8.7 s guarded). So with TIERFLOW_EXACTLY_ONCE tansu's readers can still skip;
    exactly-once is not provable on tansu anyway (it shows aborted transactions). Seeks and assigns start the
    guard over; a rebalance does not (a rebalance callback of its own, tried, hung a consumer that a second
    thread asked for its assignment during the join). A partition given back at a committed offset below where
    this consumer was is followed; one that another member moved on meanwhile is read again from where this
    consumer left it: duplicates, which answer consumers drop, never a skip.

    Pacing (pipeline/core/fetch_pacing.py): on a broker that answers an empty fetch at once (`pacing` None: known
    by its cluster id, noida), librdkafka's fetcher loops without pause whenever it has caught up: idle, that was a
    third of a core per agent, and between records under load as much. After `pacer.rest_after_s` without records
    this consumer pauses its partitions and, at each call, asks for the log's end (ListOffsets) at growing
    intervals, resuming once records are past its position.
    librdkafka's fetcher sleeps up to a second while every partition is paused and does not notice a resume by
    itself (why an earlier try of pausing stalled partitions for seconds): a request to the leader after the
    resume wakes it. Pausing keeps the position, so a record is late by at most a probe interval, never lost.
    """

    def __init__(self, conf: dict[str, Any], guard: bool = True, pacing: bool | None = None,
                 pacer: FetchPacer | None = None) -> None:
        super().__init__(conf)
        self._from_start = str(conf.get("auto.offset.reset", "latest")) in ("earliest", "smallest", "beginning")
        self.guard = GapGuard()
        self._guarded: bool | None = None if guard else False  # None until the cluster id is known
        self._pacing = pacing  # None until the cluster id is known
        self.pacer = pacer or FetchPacer()
        self._paused: list[TopicPartition] = []
        self._starts: dict[tuple[str, int], int | None] = {}  # per paused partition, the next offset to deliver
        self._learn_after = 0.0  # when the cluster id may be asked for again after a failure
        self._bell_factory: Callable[[], Bell] | None = None
        self._bell: Bell | None = None

    def listen(self, bell: Callable[[], Bell], now: bool = False, rung: bool = False) -> None:
        """Wake at once when `bell()`'s event is set, rather than at the next look. Made on the first rest, or `now`
        (a long-lived reader about to wait for records it is about to cause, as a benchmark's: subscribed before
        the first ring; a one-shot command would pay the subscription's start-up for nothing). `rung`: every
        writer of the topics rings (a tier topic: ingest and the light workers), so looks back off fully."""
        self._bell_factory = bell
        self.pacer.rung = rung
        if now and self._bell is None:
            self._bell = bell()

    def close(self) -> None:
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        super().close()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self._paced():
            return self._in_order(self._consume_paced(num_messages, timeout))
        return self._in_order(super().consume(num_messages, timeout))

    def poll(self, timeout: float = -1) -> Message | None:
        if self._paced():
            msgs = self.consume(1, timeout)
            return msgs[0] if msgs else None
        m = super().poll(timeout)
        if m is None:
            return None
        kept = self._in_order([m])
        return kept[0] if kept else None

    def seek(self, partition: TopicPartition) -> None:
        self.guard.forget([(partition.topic, partition.partition)])
        self._wake()
        super().seek(partition)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.guard.forget()
        self._wake()
        super().assign(partitions)

    def unassign(self) -> None:
        self.guard.forget()
        self._wake()
        super().unassign()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.guard.forget((tp.topic, tp.partition) for tp in partitions)
        self._wake()
        super().incremental_assign(partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._wake()
        super().incremental_unassign(partitions)

    # --- the broker's quirks, known by its cluster id
    def _learn_broker(self) -> None:
        now = time.monotonic()
        if now < self._learn_after:
            return
        try:
            cluster = self.list_topics(timeout=2).cluster_id
        except KafkaException:
            self._learn_after = now + 5.0  # the broker is down: ask again later, unpaced and unguarded meanwhile
            return
        if self._guarded is None:
            self._guarded = shows_out_of_order(cluster)
        if self._pacing is None:
            self._pacing = answers_fetches_at_once(cluster)

    def _paced(self) -> bool:
        if self._pacing is None:
            self._learn_broker()
        return bool(self._pacing)

    # --- pacing
    def away(self) -> None:
        """The application goes off to use what it was given (a model's batch). Where that typically takes
        longer than a rest, the consumer rests now: its fetcher would loop all that while (at 50 msg/s the heavy
        worker's fetcher took 18% of a core and the broker's side of it more). Pausing keeps the position, so
        whatever was prefetched is fetched again."""
        if not self._paced():
            return
        now = time.monotonic()
        self.pacer.away(now)
        if self.pacer.away_long() and not self.pacer.resting:
            self._rest(now)

    def _consume_paced(self, num: int, timeout: float) -> list[Message]:
        p = self.pacer
        p.called(time.monotonic())
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            left = None if deadline is None else deadline - now
            if not p.resting:
                hot = p.hot_left_s(now)
                msgs = super().consume(num, hot if left is None else max(0.0, min(left, hot)))
                now = time.monotonic()
                if msgs:
                    p.got(now)
                    return msgs
                if p.should_rest(now):
                    # What the fetcher already queued would be dropped by the pause (and found only by the next
                    # look, for a partition with no position yet): take it first.
                    if msgs := super().consume(num, 0):
                        p.got(time.monotonic())
                        return msgs
                    self._rest(now)
            elif p.probe_due(now):
                msgs = super().consume(num, 0)  # serves rebalance callbacks; records of a partition not paused
                if msgs:
                    self._wake()
                    return msgs
                if self._behind():
                    self._wake(expect=True)
                    continue
                if p.recheck_due(now) and (msgs := self._look(num)):
                    return msgs
                p.probed(now)
            if deadline is not None and now >= deadline:
                return []
            if p.resting:
                wait = p.wait_s(now)
                wait = wait if deadline is None else max(0.0, min(wait, deadline - now))
                if self._bell is None:
                    time.sleep(wait)
                elif self._bell.event.wait(wait):
                    # A ring is for the topic, not for this member's partitions: look before waking, so the
                    # members a record is not for stay at rest.
                    self._bell.event.clear()
                    if self._behind():
                        self._wake(expect=True)
                    else:
                        p.soon(time.monotonic())

    def _rest(self, now: float) -> None:
        """Pause every assigned partition, noting where each will be read next."""
        try:
            parts = self.assignment()
            starts: dict[tuple[str, int], int | None] = {}
            fresh: list[TopicPartition] = []
            for tp in self.position(parts) if parts else []:
                if tp.offset >= 0:
                    starts[(tp.topic, tp.partition)] = tp.offset
                else:
                    fresh.append(tp)
            starts.update(self._resume_points(fresh))
            if parts:
                self.pause(parts)
        except KafkaException as e:
            log.debug("pause failed: %s", e)
            parts = []
        if not parts:  # nothing assigned, so nothing is fetched: wait in consume() as usual
            self.pacer.got(now, records=False)
            return
        self._paused, self._starts = parts, starts
        self.pacer.rest(now)
        if self._bell is None and self._bell_factory is not None:
            self._bell = self._bell_factory()
        if self._bell is not None and not self.pacer.rung:
            # A ring while hot was most likely for records already read. Where rings are all there is between
            # looks 100 ms apart (`rung`), one that came in may not be dropped on a guess: it costs one look.
            self._bell.event.clear()

    def _resume_points(self, parts: list[TopicPartition]) -> dict[tuple[str, int], int | None]:
        """Where partitions that have delivered nothing yet will be read from once resumed: the committed offset,
        else the reset point (the log's start or end); None where that cannot be known (counts as behind)."""
        if not parts:
            return {}
        points: dict[tuple[str, int], int | None] = {(tp.topic, tp.partition): None for tp in parts}
        try:
            committed = self.committed([TopicPartition(tp.topic, tp.partition) for tp in parts], timeout=2)
        except KafkaException as e:
            log.debug("committed: %s", e)
            return points
        for tp in committed:
            if tp.offset >= 0:
                points[(tp.topic, tp.partition)] = tp.offset
                continue
            try:
                low, high = self.get_watermark_offsets(tp, timeout=2, cached=False)
            except KafkaException as e:
                log.debug("watermarks: %s", e)
                continue
            points[(tp.topic, tp.partition)] = int(low if self._from_start else high)
        return points

    def _behind(self) -> bool:
        """Whether the log's end is past this consumer's position on any partition (or the assignment changed)."""
        try:
            parts = self.assignment()
            if {(tp.topic, tp.partition) for tp in parts} != set(self._starts):
                return True
            ends = self.offsets_for_times([TopicPartition(tp.topic, tp.partition, -1) for tp in parts], timeout=2)
        except KafkaException:
            return True  # let a fetch find out what is wrong
        return behind_ends({(tp.topic, tp.partition): tp.offset for tp in ends}, self._starts)

    def _look(self, num: int) -> list[Message]:
        """Fetch once whatever the ends said, then rest again if nothing came: a record fetched into the queue just
        as the partitions were paused, before the application had read from them (no position to compare the
        ends with), is dropped by the pause; this finds it within `recheck_s`."""
        parts = self._paused
        try:
            self.resume(parts)
            self._nudge(parts)
            msgs = super().consume(num, LOOK_S)
            if msgs:
                self._paused, self._starts = [], {}
                self.pacer.got(time.monotonic())
                return msgs
            self.pause(parts)
        except KafkaException as e:
            log.debug("look: %s", e)
        self.pacer.rechecked(time.monotonic())
        return []

    def _nudge(self, parts: list[TopicPartition]) -> None:
        """Wake librdkafka's fetcher: it sleeps up to a second with every partition paused and does not notice a
        resume by itself. A request to the partitions' leader does it."""
        self.offsets_for_times([TopicPartition(tp.topic, tp.partition, -1) for tp in parts[:1]], timeout=2)

    def _wake(self, expect: bool = False) -> None:
        """Resume what was paused and make the fetcher see it; hot from now (`expect`: records are known to be
        there, hot until they come)."""
        now = time.monotonic()
        if self._paused:
            parts, self._paused, self._starts = self._paused, [], {}
            try:
                self.resume(parts)
                self._nudge(parts)
            except KafkaException as e:
                log.debug("resume: %s", e)
        if expect:
            self.pacer.expect(now)
        else:
            self.pacer.got(now, records=False)

    def _in_order(self, msgs: list[Message]) -> list[Message]:
        if not msgs:
            return msgs
        if self._guarded is None:
            self._learn_broker()
            if self._guarded is None:
                return msgs  # asked again with the next records
        if not self._guarded:
            return msgs
        out: list[Message] = []
        held: set[tuple[str, int]] = set()
        now = time.monotonic()
        for m in msgs:
            off = m.offset()
            if m.error() is not None or off is None:
                out.append(m)
                continue
            tp = (m.topic() or "", m.partition() or 0)
            if tp in held:
                continue
            again = self.guard.admit(tp, off, now)
            if again is None:
                out.append(m)
            else:
                held.add(tp)
                try:
                    super().seek(TopicPartition(tp[0], tp[1], again))
                except KafkaException as e:  # revoked meanwhile: its new owner reads it from the commit
                    log.debug("seek %s[%d] failed: %s", tp[0], tp[1], e)
        return out


def make_admin(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_config())


Headers = list[tuple[str, str | bytes | None]]


# What librdkafka counts against message.max.bytes besides key, value and headers (measured: about 40 bytes per
# record, a few per header), rounded up. A record batch adds 61 bytes of its own, which the broker counts against
# the topic's max.message.bytes: producers take BATCH_OVERHEAD off the limit, so a record librdkafka accepts is
# one the broker accepts, not a batch failure retried forever.
RECORD_OVERHEAD = 64
HEADER_OVERHEAD = 8
BATCH_OVERHEAD = 128


def producer_limit(max_message_bytes: int) -> int:
    """The largest record (key + value + headers + overhead) tierflow's producers write to a topic."""
    return max_message_bytes - BATCH_OVERHEAD


def _nbytes(x: bytes | str | None) -> int:
    return 0 if x is None else len(x.encode() if isinstance(x, str) else x)


def record_parts(value: bytes | None, key: bytes | str | None, headers: Headers | None) -> dict[str, int]:
    """The bytes of a record's value, key and headers (names, values and their framing)."""
    return {"value": _nbytes(value), "key": _nbytes(key),
            "headers": sum(_nbytes(k) + _nbytes(v) + HEADER_OVERHEAD for k, v in headers or [])}


def oversize_reason(what: str, value: bytes | None, key: bytes | str | None, headers: Headers | None,
                    limit: int | None) -> str | None:
    """Why a record cannot be written under `limit` (None: it can), naming its biggest part and every size.

    `limit` None: the producer already refused it (its message.max.bytes), say so without a number.
    """
    parts = record_parts(value, key, headers)
    total = sum(parts.values()) + RECORD_OVERHEAD
    if limit is not None and total <= limit:
        return None
    big = max(parts, key=lambda k: parts[k])
    over = f"the {limit:,}-byte record limit" if limit is not None else "the producer's message.max.bytes"
    return (f"{what}: its {big} is {parts[big]:,} bytes (value {parts['value']:,} + key {parts['key']:,} + "
            f"headers {parts['headers']:,} = {total:,} bytes with framing, over {over})")


def produce(producer: Producer, topic: str, value: bytes, key: bytes | str | None = None,
            headers: Headers | None = None, on_delivery: Any = None) -> None:
    """Produce, waiting for queue space instead of failing when the local buffer is full.

    A record too big to write raises InvalidMessage("oversize") whose reason names the part that is too big.
    """
    while True:
        try:
            producer.produce(topic, value, key=key, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)
        except KafkaException as e:
            if e.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                why = oversize_reason(f"the record for {topic}", value, key, headers, None)
                raise InvalidMessage("oversize", why or f"the record for {topic} is too big") from None
            raise


def coordinates(msgs: list[Message]) -> str:
    """Where a batch starts, as `topic[partition]@offset`: what an agent names when it dies handling it."""
    if not msgs:
        return "-"
    m = msgs[0]
    return f"{m.topic()}[{m.partition()}]@{m.offset()}"


CRASH_MARK = "crashed handling the batch at "  # `tierflow up` reads it in a dead agent's log (pipeline.ops.up)


def poll_batch(consumer: Consumer, max_size: int, timeout: float) -> list[Message]:
    """What is buffered now, up to `max_size`; only when nothing is, wait up to `timeout` for the first record.

    `consume(n, timeout)` alone waits the whole timeout for n records, which at low load adds the
    timeout to every message's latency.
    """
    msgs = consumer.consume(max_size, 0)
    if msgs:
        return msgs
    msgs = consumer.consume(1, timeout)
    if msgs and max_size > 1:
        msgs.extend(consumer.consume(max_size - 1, 0))
    return msgs


def commit(consumer: Consumer, msgs: list[Message], who: str) -> bool:
    """Commit the offsets after `msgs`; False (logged) when the group rejected it.

    A rejected commit (member unknown after a broker restart, a rebalance mid-batch) is survivable: the
    records are re-read by whoever owns the partitions next, and answer consumers dedupe by request id.
    """
    if not msgs:
        return True
    try:
        consumer.commit(offsets=next_offsets(msgs), asynchronous=False)
        return True
    except KafkaException as e:
        metrics.BROKER_ERRORS.labels(who, e.args[0].name()).inc()
        log.warning("%s: commit rejected (%s); the batch will be re-read", who, e.args[0].str())
        return False


def next_offsets(msgs: Iterable[Message]) -> list[TopicPartition]:
    """The offsets to commit after `msgs` are done: last offset + 1 per partition.

    A consumer delivers each partition in offset order, so the last record seen per partition is its
    highest (were it ever not, the commit would be lower: records re-read, never skipped).
    """
    last = {(m.topic(), m.partition()): m for m in msgs}
    return [TopicPartition(t or "", p or 0, (m.offset() or 0) + 1) for (t, p), m in last.items()
            if m.offset() is not None]


def rewind(consumer: Consumer, msgs: Iterable[Message]) -> None:
    """Seek back to the first offset of `msgs` per partition, to process them again."""
    first: dict[tuple[str, int], int] = {}
    for m in msgs:
        tp = (m.topic() or "", m.partition() or 0)
        off = m.offset()
        if off is not None and off < first.get(tp, 1 << 62):
            first[tp] = off
    for (t, p), o in first.items():
        try:
            consumer.seek(TopicPartition(t, p, o))
        except KafkaException as e:  # partition revoked meanwhile: its new owner re-reads from the commit
            log.debug("seek %s[%d] failed: %s", t, p, e)


def lag_of(consumer: Consumer) -> int:
    """Messages behind the high watermark on this consumer's partitions.

    Uses the cached watermarks from fetch responses: tansu's ListOffsets end offsets are wrong, and
    cached watermarks cost no round trip.
    """
    total = 0
    try:
        assigned = consumer.assignment()
        if not assigned:
            return 0
        for tp in consumer.position(assigned):
            low, high = consumer.get_watermark_offsets(tp, cached=True)
            if high is None or high < 0:
                continue
            pos = tp.offset if tp.offset >= 0 else low
            total += max(0, high - pos)
    except KafkaException:
        return 0
    return total


def check_reachable(address: str, what: str, timeout: float = 3.0) -> None:
    """Raise ServiceUnavailable naming `address` unless a TCP connection to it succeeds."""
    for hostport in address.split(","):
        if "://" in hostport:
            u = urlparse(hostport)
            host, port = u.hostname or "localhost", u.port or 6379
        else:
            host, _, p = hostport.strip().rpartition(":")
            port = int(p)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as e:
            last = e
    from pipeline.logs import scrub

    raise ServiceUnavailable(f"cannot reach {what} at {scrub(address)}: {last.strerror or last}")


def create_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create every pipeline topic that does not exist yet; return the names created.

    Topics are created explicitly because auto-created ones get the broker's default partition count
    (4 on tansu) and no size limits.
    """
    check_reachable(settings.kafka.servers, "Kafka")
    admin = make_admin(settings)
    specs = specs_of(settings)
    existing = set(metadata(admin, timeout).topics)
    todo = [s for s in specs if s.name not in existing]
    created: list[str] = []
    if todo:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in todo],
            operation_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    wait_for_topics(admin, [s.name for s in specs], timeout)
    return created


# A broker that takes connections before it serves them (tansu restarted on its --data storage) makes librdkafka
# fail a metadata request at once, long before its timeout: these are worth asking again.
_NOT_YET = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)


def metadata(admin: AdminClient, timeout: float) -> ClusterMetadata:
    """The cluster's metadata, asked again while the broker is not serving yet, for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return admin.list_topics(timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException as e:
            if e.args[0].code() not in _NOT_YET:
                raise
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"Kafka did not answer a metadata request within {timeout:.0f} s: "
                                         f"{e.args[0].str()}") from e
            time.sleep(0.2)


def wait_for_topics(admin: AdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        md = metadata(admin, max(0.5, deadline - time.monotonic()))
        missing = [n for n in names if n not in md.topics or md.topics[n].error is not None]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"topics not ready after {timeout:.0f}s: {', '.join(missing)}")
        time.sleep(0.1)


def delete_topics(settings: Settings, names: list[str], timeout: float = 30.0) -> None:
    admin = make_admin(settings)
    for fut in admin.delete_topics(names, operation_timeout=timeout).values():
        try:
            fut.result()
        except KafkaException as e:
            log.debug("delete: %s", e)


class Tail:
    """Reads a topic from positions fixed when it is made: its end offsets now (`start="end"`) or its beginning.

    Partitions are assigned, not subscribed: no group join on the critical path (a join takes seconds), no
    commits, no consumer group left behind. A record produced a millisecond after the Tail was made is read,
    so a command can take its Tail, then send a request, then read the answer.
    """

    def __init__(self, settings: Settings, topic: str, start: str = "end", timeout: float = 10.0,
                 listen: bool = False) -> None:
        """`listen`: wake on the ring of the topic's writers (workers ring answers and handovers) while resting."""
        if start not in ("end", "beginning"):
            raise ValueError(f"start must be 'end' or 'beginning', not {start!r}")
        self.topic = topic
        # group.id only because librdkafka wants one; with assign() and no commits the group never exists.
        self.consumer: Consumer = make_consumer(settings, f"tierflow-tail-{time.time_ns()}",
                                                **{"enable.auto.commit": False})
        md = self.consumer.list_topics(topic, timeout=timeout)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            self.consumer.close()
            raise ServiceUnavailable(f"topic {topic} does not exist on {settings.kafka.servers} "
                                     "(tierflow topics create)")
        parts = sorted(meta.partitions)
        marks = {p: self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
                 for p in parts}
        self.ends = {p: int(high) for p, (_, high) in marks.items()}
        if counts_batches(md.cluster_id):
            self.ends = self._fetched_ends(timeout)
        self.next = dict(self.ends) if start == "end" else {p: int(low) for p, (low, _) in marks.items()}
        self.consumer.assign([TopicPartition(topic, p, o) for p, o in self.next.items()])
        if listen and isinstance(self.consumer, OrderedConsumer):
            from pipeline.adapters.doorbell import Bell as Doorbell

            self.consumer.listen(lambda: Doorbell(settings, [topic]))

    def _fetched_ends(self, timeout: float) -> dict[int, int]:
        """End offsets from a fetch response's high watermarks, for a broker whose ListOffsets counts batches.

        ListOffsets' (low) answer is a lower bound: fetching from there returns the true high watermark.
        """
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in self.ends.items()])
        found: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(self.ends) and time.monotonic() < deadline:
            self.consumer.consume(1000, 0.05)
            for p in self.ends:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                if high is not None and high >= self.ends[p]:
                    found[p] = int(high)
        self.consumer.unassign()
        return {p: found.get(p, o) for p, o in self.ends.items()}

    def poll(self, timeout: float = 0.5, max_records: int = 1000) -> list[Message]:
        """The records that arrived (what is buffered now; only if nothing is, waits up to `timeout`)."""
        out = []
        for m in poll_batch(self.consumer, max_records, timeout):
            if m.error() is not None:
                continue
            off = m.offset()
            if off is not None:
                self.next[m.partition() or 0] = off + 1
            out.append(m)
        return out

    @property
    def caught_up(self) -> bool:
        """True once every record that existed when the Tail was made has been read."""
        return all(self.next[p] >= end for p, end in self.ends.items())

    def close(self) -> None:
        self.consumer.close()

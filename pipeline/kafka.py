"""Kafka clients with tierflow's defaults, topic creation, and the at-least-once bookkeeping helpers.

Defaults that matter: offsets are committed explicitly after outputs are flushed (never auto);
short session/heartbeat/fetch-wait times so group joins and fetches are fast (on tansu the librdkafka
defaults make a join take 20+ s and triple latency).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline import metrics
from pipeline.errors import InvalidMessage, ServiceUnavailable
from pipeline.settings import Settings
from pipeline.topics import Topics, TopicSpec, topic_specs

log = logging.getLogger(__name__)


def topics_of(settings: Settings) -> Topics:
    return Topics(settings.topic_prefix)


def specs_of(settings: Settings) -> list[TopicSpec]:
    return topic_specs(topics_of(settings), settings.partitions, settings.replication_factor,
                       settings.max_message_bytes)


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


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    conf = settings.kafka_config()
    conf.update({
        "linger.ms": 2,
        "acks": "all",
        "message.max.bytes": settings.max_message_bytes,
        "queue.buffering.max.messages": 1_000_000,
        "batch.num.messages": 10_000,
        "compression.type": settings.kafka_compression,
    })
    conf.update(overrides)
    return Producer(conf)


def make_consumer(settings: Settings, group: str, **overrides: Any) -> Consumer:
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
    })
    conf.update(overrides)
    return Consumer(conf)


def make_admin(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_config())


Headers = list[tuple[str, str | bytes | None]]


def produce(producer: Producer, topic: str, value: bytes, key: bytes | str | None = None,
            headers: Headers | None = None, on_delivery: Any = None) -> None:
    """Produce, waiting for queue space instead of failing when the local buffer is full."""
    while True:
        try:
            producer.produce(topic, value, key=key, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)
        except KafkaException as e:
            if e.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise InvalidMessage("oversize", f"a {len(value)}-byte record for {topic} is over the "
                                                 "producer's message.max.bytes") from None
            raise


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
    check_reachable(settings.bootstrap, "Kafka")
    admin = make_admin(settings)
    specs = specs_of(settings)
    existing = set(admin.list_topics(timeout=timeout).topics)
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


def wait_for_topics(admin: AdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
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

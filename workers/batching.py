"""Size-or-deadline micro-batching at the edge: one consume() call per batch, bounded by time."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline import metrics
from pipeline.adapters.kafka import poll_batch


def collect_batch(consumer: Consumer, max_size: int, max_wait_s: float, idle_timeout_s: float = 0.1,
                  first: list[Message] | None = None, adaptive: bool = True) -> list[Message]:
    """Up to `max_size` records: wait up to `idle_timeout_s` for the first, then at most `max_wait_s` more.

    `adaptive`: after taking what is buffered, wait for company only while the broker holds more records for
    the batch's partitions than were fetched (`behind`). A lone message goes at once, and under load batches
    still fill, because records keep arriving while the last batch is served. Fixed: a lone message always
    waits `max_wait_s` (the deadline bounds both). `first`: records the caller already consumed.
    """
    if not first:
        first = poll_batch(consumer, max_size, idle_timeout_s)
    batch = _ok(first, consumer)
    if not first or len(first) >= max_size:
        return batch
    deadline = time.monotonic() + max_wait_s
    last = first
    while len(batch) < max_size:
        more = consumer.consume(max_size - len(batch), 0) if adaptive else []
        if not more:
            if adaptive and not behind(consumer, last):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            more = consumer.consume(max_size - len(batch), left)
        if not more:
            break
        batch.extend(_ok(more, consumer))
        last = more
    return batch


def behind(consumer: Consumer, msgs: list[Message]) -> bool:
    """Whether the broker held records past `msgs` in any of their partitions when it last answered a fetch.

    Reads the high watermarks librdkafka cached from fetch responses: no broker round trip.
    """
    ends: dict[tuple[str | None, int | None], int] = {}
    for m in msgs:
        offset = m.offset()
        if m.error() is None and offset is not None:
            ends[(m.topic(), m.partition())] = offset + 1
    for (topic, partition), nxt in ends.items():
        if topic is None or partition is None:
            continue
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return False
        if high is not None and high > nxt:
            return True
    return False


def _ok(msgs: list[Message], consumer: Consumer) -> list[Message]:
    out = []
    for m in msgs:
        err = m.error()
        if err is None:
            out.append(m)
        elif err.code() != KafkaError._PARTITION_EOF:
            metrics.BROKER_ERRORS.labels("worker", err.name()).inc()
    return out

"""Size-or-deadline micro-batching at the edge: one consume() call per batch, bounded by time."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, Message

from pipeline import metrics
from pipeline.adapters.kafka import poll_batch


def collect_batch(consumer: Consumer, max_size: int, max_wait_s: float, idle_timeout_s: float = 0.1,
                  first: list[Message] | None = None) -> list[Message]:
    """Up to `max_size` records: wait up to `idle_timeout_s` for the first, then at most `max_wait_s` more.

    A lone message waits no longer than `max_wait_s` for company, so latency at low load stays low and
    batches fill up under load. `first`: records the caller already consumed to start the batch.
    """
    if not first:
        first = poll_batch(consumer, max_size, idle_timeout_s)
    batch = _ok(first, consumer)
    if not first or len(first) >= max_size:
        return batch
    deadline = time.monotonic() + max_wait_s
    while len(batch) < max_size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        more = consumer.consume(max_size - len(batch), left)
        if not more:
            break
        batch.extend(_ok(more, consumer))
    return batch


def _ok(msgs: list[Message], consumer: Consumer) -> list[Message]:
    out = []
    for m in msgs:
        err = m.error()
        if err is None:
            out.append(m)
        elif err.code() != KafkaError._PARTITION_EOF:
            metrics.BROKER_ERRORS.labels("worker", err.name()).inc()
    return out

"""Dead letters: the original bytes, unchanged, with the reason in headers (schemas/dlq.v1.json)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Message, Producer

from pipeline import metrics
from pipeline.kafka import DeliveryTracker, Headers, make_output_producer, produce, topics_of
from pipeline.settings import Settings

MAX_REASON_CHARS = 1000


def error_headers(kind: str, reason: str, stage: str, source: str, partition: int, offset: int) -> Headers:
    """The headers that explain a dead letter (schemas/dlq.v1.json)."""
    return [
        ("x-error", reason[:MAX_REASON_CHARS].encode("utf-8", "replace")),
        ("x-error-kind", kind.encode()),
        ("x-source-topic", source.encode()),
        ("x-source-partition", str(partition).encode()),
        ("x-source-offset", str(offset).encode()),
        ("x-stage", stage.encode()),
        ("x-failed-at", str(int(time.time() * 1000)).encode()),
    ]


def dlq_headers(msg: Message, kind: str, reason: str, stage: str) -> Headers:
    """Error headers for a consumed record; the record's own headers are kept after them."""
    offset = msg.offset()
    own = error_headers(kind, reason, stage, msg.topic() or "", msg.partition() or 0,
                        offset if offset is not None else -1)
    src: Headers = [(k, v) for k, v in _pairs(msg) if not k.startswith("x-")]
    return own + src


def _pairs(msg: Message) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


def to_dlq(producer: Producer, dlq_topic: str, msg: Message, kind: str, reason: str, stage: str,
           on_delivery: Any = None, max_bytes: int = 1 << 20) -> None:
    """Send `msg` (its original key and value) to the dead-letter topic with the reason.

    A value too big to produce again is cut to `max_bytes` less a margin for headers, and says so in
    `x-truncated` (its original size): the reason and the source offset still let anyone find the rest.
    """
    metrics.DLQ.labels(stage, kind).inc()
    value = msg.value() or b""
    headers = dlq_headers(msg, kind, reason, stage)
    room = max(0, max_bytes - 64 * 1024)
    if len(value) > room:
        headers.append(("x-truncated", str(len(value)).encode()))
        value = value[:room]
    produce(producer, dlq_topic, value, key=msg.key(), headers=headers, on_delivery=on_delivery)


def headers_dict(msg: Message) -> dict[str, str]:
    """A record's headers as text (the last value wins), for readers of the DLQ."""
    return {k: (v or b"").decode("utf-8", "replace") for k, v in _pairs(msg)}


class DeadLetters:
    """An agent's way to the dead-letter topic: a producer of its own, with the output codec (operators read the
    DLQ with whatever client they have), flushed by the agent before it commits the batch the records came from.

    It is never transactional: a dead letter may repeat when its batch is retried, it is never lost.
    """

    def __init__(self, settings: Settings, stage: str) -> None:
        self.topic = topics_of(settings).dlq
        self.stage = stage
        self.max_bytes = settings.max_message_bytes
        self.delivery = DeliveryTracker()
        self.producer = make_output_producer(settings, on_delivery=self.delivery,
                                             **{"delivery.report.only.error": True})
        self.count = 0

    def send(self, msg: Message, kind: str, reason: str, stage: str | None = None) -> None:
        """Dead-letter a consumed record (its original key, value and headers) with the reason."""
        to_dlq(self.producer, self.topic, msg, kind, reason, stage or self.stage, self.delivery, self.max_bytes)
        self.count += 1

    def send_raw(self, value: bytes, headers: Headers, key: bytes | None = None) -> None:
        """Dead-letter bytes that did not come from a consumed record (a replayed file line)."""
        produce(self.producer, self.topic, value, key=key, headers=headers, on_delivery=self.delivery)
        self.count += 1

    def flush(self, timeout: float) -> bool:
        """Wait until every dead letter is acknowledged. False (and the failures reset) when any was not."""
        left = self.producer.flush(timeout) if len(self.producer) else 0
        ok = left == 0 and not self.delivery.failed
        self.delivery.reset()
        return ok

"""Dead letters: the original bytes, unchanged, with the reason in headers (schemas/dlq.v1.json)."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Message, Producer

from pipeline import metrics
from pipeline.kafka import Headers, produce

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

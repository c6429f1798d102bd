"""Dead letters: the original bytes, unchanged, with the reason in headers (schemas/dlq.v1.json)."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Message, Producer

from pipeline import metrics
from pipeline.adapters.kafka import (
    RECORD_OVERHEAD,
    DeliveryTracker,
    Headers,
    make_output_producer,
    produce,
    producer_limit,
    record_parts,
    topics_of,
)
from pipeline.errors import InvalidMessage
from pipeline.settings import Settings

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 1000


ERROR_HEADERS = ("x-error", "x-error-kind", "x-source-topic", "x-source-partition", "x-source-offset", "x-stage",
                 "x-failed-at")


def error_headers(kind: str, reason: str, stage: str, source: str, partition: int, offset: int) -> Headers:
    """The headers that explain a dead letter (schemas/dlq.v1.json), in the order of ERROR_HEADERS."""
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


def fit(value: bytes, key: bytes | None, headers: Headers, limit: int,
        keep: int = 0) -> tuple[bytes, bytes | None, Headers] | None:
    """A dead letter cut down to fit `limit`: the biggest of the value, the key and the record's own header values
    is cut first, as little as needed, then the next. Where header names and framing are the bulk (thousands of
    headers), the record's own headers go altogether first. `x-truncated` says what was cut and its original
    size in bytes (e.g. ``key=9000000``). The first `keep` headers (the error headers) are never cut. None when
    even that does not fit."""
    parts = record_parts(value, key, headers)
    if sum(parts.values()) + RECORD_OVERHEAD <= limit:
        return value, key, headers
    own, src = list(headers[:keep]), list(headers[keep:])
    note_room = 512  # the x-truncated header itself
    # Running sizes: a record may carry thousands of headers, so nothing is recounted per cut.
    over = sum(parts.values()) + RECORD_OVERHEAD + note_room - limit
    # (name, current bytes) of every part that can be cut; header parts by their index in src
    pieces: dict[str, bytes] = {"value": value, "key": key or b""}
    pieces.update({f"header:{i}": v.encode() if isinstance(v, str) else v or b"" for i, (_, v) in enumerate(src)})
    cut: dict[str, int] = {}
    if src and over > sum(len(v) for v in pieces.values()):  # names and framing are the bulk: the headers go
        over -= parts["headers"]
        cut["headers"] = len(src)
        src, pieces = [], {"value": value, "key": key or b""}
    while over > 0:
        name = max(pieces, key=lambda n: len(pieces[n]))
        data = pieces[name]
        if not data:
            return None
        take = min(over, len(data))
        cut.setdefault(name, len(data))
        pieces[name] = data[:len(data) - take]
        over -= take
    value, key = pieces["value"], pieces["key"] or None
    src = [(n, pieces[f"header:{i}"] if v else v) for i, (n, v) in enumerate(src)]

    def label(name: str) -> str:
        if name.startswith("header:"):
            return f"header:{headers[keep + int(name.split(':', 1)[1])][0]}"
        return name

    note = ",".join(f"{n}={cut[n]} dropped" if n == "headers" else f"{label(n)}={cut[n]}" for n in cut)
    return value, key, [*own, *src, ("x-truncated", note[:note_room - 32].encode("utf-8", "replace"))]


def to_dlq(producer: Producer, dlq_topic: str, msg: Message, kind: str, reason: str, stage: str,
           on_delivery: Any = None, max_bytes: int = 1 << 20) -> bool:
    """Send `msg` (its original key, value and headers) to the dead-letter topic with the reason.

    What cannot be written as it is, is cut to fit (see `fit`): the reason and the source offset still let anyone
    find the rest. Returns False when even the cut record cannot be written: the caller counts it as skipped.
    """
    headers = dlq_headers(msg, kind, reason, stage)
    if not produce_fitted(producer, dlq_topic, msg.value() or b"", msg.key(), headers, len(ERROR_HEADERS),
                          max_bytes, on_delivery):
        return False
    metrics.DLQ.labels(stage, kind).inc()
    return True


def produce_fitted(producer: Producer, topic: str, value: bytes, key: bytes | None, headers: Headers, keep: int,
                   max_bytes: int, on_delivery: Any = None) -> bool:
    """Produce a dead letter cut to fit (see `fit`; the first `keep` headers are never cut). False when even the
    cut record cannot be written."""
    fitted = fit(value, key, headers, producer_limit(max_bytes), keep=keep)
    if fitted is None:
        return False
    value, key, headers = fitted
    try:
        produce(producer, topic, value, key=key, headers=headers, on_delivery=on_delivery)
    except InvalidMessage:
        return False
    return True


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

    def send(self, msg: Message, kind: str, reason: str, stage: str | None = None) -> bool:
        """Dead-letter a consumed record (its original key, value and headers, cut to fit) with the reason.

        False when even a cut copy cannot be written: the record is skipped (counted, logged once with its
        coordinates) and its offset is committed with its batch, never retried.
        """
        stage = stage or self.stage
        if to_dlq(self.producer, self.topic, msg, kind, reason, stage, self.delivery, self.max_bytes):
            self.count += 1
            return True
        metrics.SKIPPED.labels(stage, kind).inc()
        log.error("%s: skipped %s[%s]@%s (%s: %s): not even a truncated copy fits the dead-letter topic", stage,
                  msg.topic(), msg.partition(), msg.offset(), kind, reason[:300])
        return False

    def send_raw(self, value: bytes, headers: Headers, key: bytes | None = None) -> bool:
        """Dead-letter bytes that did not come from a consumed record (a replayed file line), cut to fit as
        `send` does; `headers` are the error headers, never cut. False (counted, logged) when nothing fits."""
        if not produce_fitted(self.producer, self.topic, value, key, headers, len(headers), self.max_bytes,
                              self.delivery):
            kind = next((v for k, v in headers if k == "x-error-kind"), b"unknown")
            metrics.SKIPPED.labels(self.stage, kind.decode() if isinstance(kind, bytes) else str(kind)).inc()
            log.error("%s: skipped a %d-byte record: not even a truncated copy fits the dead-letter topic",
                      self.stage, len(value))
            return False
        self.count += 1
        return True

    def flush(self, timeout: float) -> bool:
        """Wait until every dead letter is acknowledged. False (and the failures reset) when any was not."""
        left = self.producer.flush(timeout) if len(self.producer) else 0
        ok = left == 0 and not self.delivery.failed
        if not ok:
            log.error("%s: %d dead letters not acknowledged, %d still queued: %s", self.stage, self.delivery.failed,
                      left, "; ".join(self.delivery.errors) or "timed out")
        self.delivery.reset()
        return ok

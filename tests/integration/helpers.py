"""Helpers for integration tests: produce requests, drain topics."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Consumer, Message

from pipeline.kafka import make_consumer, make_producer
from pipeline.settings import Settings


def produce_all(settings: Settings, topic: str, values: list[bytes | None], keys: list[str] | None = None) -> None:
    p = make_producer(settings)
    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, v, key=keys[i] if keys else None)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(30) == 0


def reader(settings: Settings, topic: str) -> Consumer:
    c = make_consumer(settings, f"test-{uuid.uuid4().hex[:8]}")
    c.subscribe([topic])
    return c


def drain(consumer: Consumer, until: Callable[[list[Message]], bool], timeout: float,
          settle: float = 0.0) -> list[Message]:
    """Read records until `until(all_so_far)` holds (then `settle` more seconds) or `timeout` passes."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    done_at: float | None = None
    while time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.2):
            if m.error() is None:
                out.append(m)
        if done_at is None and until(out):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at >= settle:
            break
    return out


def values(msgs: list[Message]) -> list[dict[str, Any]]:
    return [orjson.loads(m.value() or b"null") for m in msgs]


def wait_ready(settings: Settings, tiers: list[str], timeout: float = 120.0) -> None:
    """Until each tier has a worker with models loaded and partitions assigned (and ingest had a moment)."""
    import redis

    from pipeline.heartbeats import ready_tiers

    r = redis.Redis.from_url(settings.redis)
    deadline = time.monotonic() + timeout
    while set(ready_tiers(r, settings.redis_prefix, tiers)) != set(tiers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not ready: {tiers}")
        time.sleep(0.1)

"""Helpers for integration tests: produce requests, drain topics."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from confluent_kafka import Consumer, Message

from pipeline.adapters.kafka import make_consumer, make_producer, topics_of
from pipeline.settings import Settings


def produce_all(settings: Settings, topic: str, values: Sequence[bytes | None], keys: list[str] | None = None) -> None:
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

    from pipeline.adapters.heartbeats import ready_tiers

    r = redis.Redis.from_url(settings.redis.address)
    deadline = time.monotonic() + timeout
    while set(ready_tiers(r, settings.redis.prefix, tiers)) != set(tiers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not ready: {tiers}")
        time.sleep(0.1)


TEXTS = ["my card has not arrived", "How do I reset my PIN?", "I want a refund for a purchase I never made, "
         "the shop charged me twice and will not answer my emails", "我的卡还没有收到"]


class Live:
    """Live traffic at `rate` msg/s in a thread, cycling through `texts`; ids are `{tag}-{n}`."""

    def __init__(self, s: Settings, tag: str, rate: float, texts: list[str] | None = None) -> None:
        self.s, self.tag, self.rate = s, tag, rate
        self.texts = texts or TEXTS
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Live:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)

    def _run(self) -> None:
        p = make_producer(self.s)
        topic = topics_of(self.s).requests
        t0 = time.monotonic()
        while not self._stop.is_set():
            rid = f"{self.tag}-{len(self.sent)}"
            p.produce(topic, orjson.dumps({"id": rid, "text": self.texts[len(self.sent) % len(self.texts)]}), key=rid)
            self.sent.append(rid)
            p.poll(0)
            ahead = len(self.sent) / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        p.flush(10)

"""Micro-batching on the real broker: a lone message does not wait for company; a backlog fills batches.

The deadlines here are long (2 s) so that the difference between waiting and not waiting is a behaviour, not a
timing: adaptive batching returns a lone record well before the deadline, fixed batching waits it out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from pipeline.adapters.kafka import make_consumer, make_producer, topics_of
from pipeline.settings import Settings
from workers.batching import behind, collect_batch

pytestmark = pytest.mark.integration

DEADLINE_S = 2.0


def subscribed(s: Settings, topic: str) -> Consumer:
    c = make_consumer(s, s.group("batching-test"))
    c.subscribe([topic])
    end = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < end:
        c.poll(0.1)
    assert c.assignment(), "no partitions assigned within 30 s"
    return c


def send(s: Settings, topic: str, n: int) -> None:
    p = make_producer(s)
    for i in range(n):
        p.produce(topic, b"m%d" % i, key=b"k")  # one key: one partition, in order
    p.flush(10)


def test_a_lone_message_goes_without_waiting_for_the_deadline(settings_factory: Callable[..., Settings]) -> None:
    s = settings_factory()
    t = topics_of(s).tier("light")
    c = subscribed(s, t)
    try:
        send(s, t, 1)
        t0 = time.monotonic()
        batch = collect_batch(c, 32, DEADLINE_S, idle_timeout_s=10.0)
        took = time.monotonic() - t0
        assert [m.value() for m in batch] == [b"m0"]
        assert took < DEADLINE_S / 2, f"a lone message waited {took:.2f} s for company"
    finally:
        c.close()


def test_fixed_batching_waits_for_the_deadline(settings_factory: Callable[..., Settings]) -> None:
    s = settings_factory()
    t = topics_of(s).tier("light")
    c = subscribed(s, t)
    try:
        send(s, t, 1)
        first = c.consume(1, 10.0)
        assert first
        t0 = time.monotonic()
        batch = collect_batch(c, 32, DEADLINE_S, first=first, adaptive=False)
        assert len(batch) == 1
        assert time.monotonic() - t0 >= DEADLINE_S * 0.9
    finally:
        c.close()


def test_a_backlog_fills_whole_batches_in_order(settings_factory: Callable[..., Settings]) -> None:
    s = settings_factory()
    t = topics_of(s).tier("light")
    send(s, t, 100)
    c = subscribed(s, t)
    try:
        first = c.consume(1, 10.0)
        assert first and behind(c, first), "99 records past the first: the consumer is behind"
        got = collect_batch(c, 40, DEADLINE_S, first=first)
        assert len(got) == 40
        rest: list[bytes] = []
        while len(rest) < 60:
            batch = collect_batch(c, 40, DEADLINE_S, idle_timeout_s=5.0)
            assert batch, "records left unread"
            rest += [m.value() or b"" for m in batch]
        assert [m.value() for m in got] + rest == [b"m%d" % i for i in range(100)]
        assert not behind(c, batch)
    finally:
        c.close()

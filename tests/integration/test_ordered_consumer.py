"""OrderedConsumer on the real broker: a consumer reading a partition as several producers write it is given
every record once, at contiguous offsets, and still follows a seek back.

On tansu a plain consumer can be shown a later batch before an earlier one and skip the earlier for good
(bench/ordering.py measures it: about 1 record in 60,000 with 6 producers); the guard there re-reads from the
expected offset. Elsewhere the consumer is a plain one (a Kafka transaction marker is a gap it must not wait on).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Message, TopicPartition

from bench.ordering import Writers
from pipeline.adapters.brokers import EmbeddedBroker
from pipeline.adapters.kafka import OrderedConsumer, make_consumer, topics_of
from pipeline.settings import Settings

pytestmark = pytest.mark.integration

PRODUCERS, PER, RATE = 4, 2500, 1000.0


def test_a_tailing_consumer_gets_every_record_once_at_contiguous_offsets(
        settings_factory: Callable[..., Settings], broker: EmbeddedBroker | None) -> None:
    s = settings_factory()
    topic = topics_of(s).answers  # written by every worker at once, in the pipeline
    c = make_consumer(s, f"{s.topic.prefix}ordered")
    assert isinstance(c, OrderedConsumer)
    c.subscribe([topic])
    got: list[Message] = []

    # One thread uses the consumer, as every tierflow loop does.
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        got.extend(m for m in c.consume(100, 0.2) if m.error() is None)
    writers = Writers(s, topic, PRODUCERS, PER, RATE).start()
    acked = writers.acked
    deadline = time.monotonic() + PER / RATE + 60
    while time.monotonic() < deadline and (writers.alive() or len(got) < len(acked)):
        got.extend(m for m in c.consume(2000, 0.2) if m.error() is None)
    writers.join()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        got.extend(m for m in c.consume(2000, 0.2) if m.error() is None)
    try:
        assert len(acked) == PRODUCERS * PER
        values = [m.value() or b"" for m in got]
        assert set(values) == acked and len(values) == len(acked), (len(acked - set(values)),
                                                                    len(values) - len(set(values)))
        by_partition: dict[int, list[int]] = {}
        for m in got:
            by_partition.setdefault(m.partition() or 0, []).append(m.offset() or 0)
        for p, offsets in by_partition.items():
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"partition {p} jumped"
        # Guarded exactly where the broker needs it (known by its cluster id).
        assert c._guarded is (broker is not None and broker.name == "tansu")
        assert c.guard.passed == 0  # no real gap without transactions
        # A seek back (a rewind after a failed delivery) is followed, not taken for a gap.
        p0 = TopicPartition(topic, 0, 0)
        c.seek(p0)
        again: list[Message] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(again) < 10:
            again += [m for m in c.consume(100, 0.2) if m.error() is None and m.partition() == 0]
        assert [m.offset() for m in again[:10]] == list(range(10))
    finally:
        c.close()

"""OrderedConsumer on the real broker: a consumer reading a partition as several producers write it is given
every record once, at contiguous offsets, and still follows a seek back.

On tansu a plain consumer can be shown a later batch before an earlier one and skip the earlier for good
(bench/ordering.py measures it: about 1 record in 60,000 with 6 producers); the guard there re-reads from the
expected offset. Elsewhere the consumer is a plain one (a Kafka transaction marker is a gap it must not wait on).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, Producer, TopicPartition

from bench.ordering import Writers
from pipeline.adapters.brokers import EmbeddedBroker
from pipeline.adapters.kafka import OrderedConsumer, make_consumer, topics_of
from pipeline.adapters.lanes import backfill_consumer_config
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


def test_with_transactions_the_guard_is_off_and_commit_markers_pass(settings_factory: Callable[..., Settings]) -> None:
    """Every commit marker is a gap in the offsets a read_committed consumer sees; guarded, each would hold a
    reader for GapGuard.grace_s (measured on tansu: 5 transactions read in 8.7 s). With TIERFLOW_EXACTLY_ONCE
    the consumers are plain ones."""
    s = settings_factory(exactly_once=True)
    topic = topics_of(s).answers
    p = Producer({**s.kafka_config(), "transactional.id": f"{s.topic.prefix}tx"})
    p.init_transactions(30)
    for t in range(5):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, f"{t}-{i}".encode(), partition=0)
        p.commit_transaction(30)
    c = make_consumer(s, f"{s.topic.prefix}tx-reader")
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < 15:
            got += [m for m in c.consume(100, 0.2) if m.error() is None]
        assert [m.value() for m in got] == [f"{t}-{i}".encode() for t in range(5) for i in range(3)]
        assert isinstance(c, OrderedConsumer) and c._guarded is False and c.guard.passed == 0
    finally:
        c.close()


def test_an_idle_consumer_rests_on_a_broker_that_answers_fetches_at_once_and_wakes_for_a_record(
        settings_factory: Callable[..., Settings], broker: EmbeddedBroker | None) -> None:
    """On noida an idle consumer pauses its partitions (no fetch loop) and a record produced later still arrives,
    within a probe interval, with nothing skipped; elsewhere (the broker holds fetches) it never pauses."""
    s = settings_factory(kafka_rest_after_ms=200.0, kafka_rest_max_ms=50.0)
    topic = topics_of(s).answers
    c = make_consumer(s, f"{s.topic.prefix}paced")
    assert isinstance(c, OrderedConsumer)
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.consume(100, 0.2)
    paced = broker is not None and broker.name == "noida"
    p = Producer(s.kafka_config())
    try:
        for i in range(5):
            quiet = time.monotonic() + 0.6  # past rest_after: resting, as an idle agent is
            while time.monotonic() < quiet:
                assert c.consume(100, 0.05) == []
            assert c.pacer.resting is paced and bool(c._paused) is paced
            sent = time.monotonic()
            p.produce(topic, f"r{i}".encode(), partition=i % 4)
            p.flush(10)
            got: list[Message] = []
            while not got and time.monotonic() - sent < 5:
                got = [m for m in c.consume(100, 0.1) if m.error() is None]
            waited = time.monotonic() - sent
            assert [m.value() for m in got] == [f"r{i}".encode()], f"record {i} not delivered in {waited:.1f}s"
            assert waited < 1.0, f"record {i} took {waited:.2f}s to arrive"  # a lost wake-up takes a second or more
            assert not c.pacer.resting
    finally:
        c.close()



def test_a_backfill_lane_that_rests_between_its_batches_gets_every_record(
        settings_factory: Callable[..., Settings]) -> None:
    """A backfill lane takes a batch (consume(n, 0)) at most every `replay.gap_ms` while a replay writes its topic;
    with a short `rest_after` it rests between batches. Before a woken consumer stayed hot until its records came,
    each probe woke it, the next call paused it again before the fetch (backed off 200 ms after a full queue) came
    back, and the lane starved: 31 of 3,000 delivered in 20 s, 2,969 undelivered in 60 s beside a busy suite
    (pipeline/core/fetch_pacing.py)."""
    s = settings_factory(kafka_rest_after_ms=2.0)
    topic = topics_of(s).answers
    n, per_s = 3000, 1500.0
    c = make_consumer(s, f"{s.topic.prefix}lane", rest_max_ms=s.replay.fetch_wait_ms, **backfill_consumer_config(s))
    assert isinstance(c, OrderedConsumer)
    c.subscribe([topic])

    def write() -> None:
        p = Producer(s.kafka_config())
        start = time.monotonic()
        for i in range(n):
            p.produce(topic, str(i).encode(), key=str(i).encode())
            p.poll(0)
            time.sleep(max(0.0, start + i / per_s - time.monotonic()))
        p.flush(10)

    got: list[Message] = []
    try:
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:
            c.consume(1, 0.1)
        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 30  # 3,000 at 200 a batch every 100 ms: about 3 s here when it works
        while len(got) < n and time.monotonic() < deadline:
            got += [m for m in c.consume(s.replay.batch, 0) if m.error() is None]
            time.sleep(s.replay.gap_ms / 1000.0)
        writer.join()
        missing = {str(i).encode() for i in range(n)} - {m.value() for m in got}
        assert not missing, f"{len(missing)} of {n} records never delivered"
    finally:
        c.close()

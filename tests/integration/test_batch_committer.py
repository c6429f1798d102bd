"""BatchCommitter on the real broker: a batch is committed only once its outputs and dead letters were
acknowledged; otherwise the consumer is rewound and reads the same batch again.

Deliveries fail for real, through librdkafka's delivery reports: outputs or dead letters sent to a broker that is
not there time out after 1 s. (The embedded broker takes records over a topic's max.message.bytes, and a
partition it does not have is refused by produce() itself, so neither makes a delivery fail.)
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from pipeline.adapters.batches import BatchCommitter
from pipeline.adapters.dlq import DeadLetters, error_headers
from pipeline.adapters.kafka import DeliveryTracker, make_member, make_output_producer, make_producer, topics_of
from pipeline.ops.devstack import free_port
from pipeline.settings import Settings
from tests.integration.helpers import produce_all

pytestmark = pytest.mark.integration

LOSES = {"delivery.report.only.error": True, "message.timeout.ms": 1000, "log_level": 2}  # no reconnect noise


def nowhere(s: Settings) -> Settings:
    """`s` pointing at a port where no broker listens: what is produced there times out undelivered."""
    return s.updated(kafka_bootstrap=f"127.0.0.1:{free_port()}")


def lose_dead_letters(dlq: DeadLetters, s: Settings) -> None:
    dlq.producer = make_output_producer(nowhere(s), **LOSES)


def dead_letter(dlq: DeadLetters, topic: str) -> None:
    assert dlq.send_raw(b"poison", error_headers("internal", "test", "test", topic, 0, 0))


@dataclass
class Rig:
    s: Settings
    source: str
    out: str
    consumer: Consumer
    producer: Producer
    delivery: DeliveryTracker
    dlq: DeadLetters
    committer: BatchCommitter

    def batch(self, n: int, timeout: float = 60.0) -> list[Message]:
        """The next `n` records the consumer reads (the group joined on the first call)."""
        got: list[Message] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got.extend(m for m in self.consumer.consume(n - len(got), 0.5) if m.error() is None)
        assert len(got) == n, f"read {len(got)} of {n} records"
        return got

    def committed(self) -> dict[int, int]:
        """partition -> committed offset (negative: nothing committed), for the partitions read."""
        parts = [TopicPartition(self.source, p) for p in range(self.s.partitions)]
        return {tp.partition: tp.offset for tp in self.consumer.committed(parts, timeout=10)}


@pytest.fixture
def rig(settings_factory: Callable[..., Settings]) -> Iterator[Rig]:
    s = settings_factory(partitions=1)
    topics = topics_of(s)
    produce_all(s, topics.requests, [b"r%d" % i for i in range(6)])
    consumer = make_member(s, f"test-committer-{uuid.uuid4().hex[:8]}")
    consumer.subscribe([topics.requests])
    delivery = DeliveryTracker()
    producer = make_producer(s, on_delivery=delivery, **{"delivery.report.only.error": True})
    dlq = DeadLetters(s, "test")
    committer = BatchCommitter(consumer, producer, delivery, dlq, "test", 30.0)
    yield Rig(s, topics.requests, topics.results, consumer, producer, delivery, dlq, committer)
    consumer.close()


def offsets(msgs: list[Message]) -> list[int]:
    return [m.offset() or 0 for m in msgs]


def test_a_delivered_batch_is_committed(rig: Rig) -> None:
    batch = rig.batch(3)
    for m in batch:
        rig.producer.produce(rig.out, b"answer to " + (m.value() or b""))
    assert rig.committer.finish(batch)
    assert rig.committed() == {0: 3}
    assert offsets(rig.batch(3)) == [3, 4, 5], "the next batch starts after the committed one"


def test_a_failed_delivery_rewinds_and_the_batch_is_read_again(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    delivery = DeliveryTracker()
    lost = make_producer(nowhere(rig.s), on_delivery=delivery, **LOSES)
    committer = BatchCommitter(rig.consumer, lost, delivery, rig.dlq, "test", 30.0)
    batch = rig.batch(3)
    lost.produce(rig.out, b"lost")
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pipeline.adapters.batches"):
        assert not committer.finish(batch)
    assert time.monotonic() - t0 >= 1.5, "no back-off after a failed batch (1 s to time out, then 0.5 s)"
    assert "test: 1 records not delivered" in caplog.text and "re-processing the batch" in caplog.text
    assert delivery.failed == 0, "the tracker was not reset for the next try"
    assert rig.committed()[0] < 0, "a batch with a lost output was committed"
    again = rig.batch(3)
    assert offsets(again) == offsets(batch) == [0, 1, 2]
    # the retry delivers: committed now
    assert rig.committer.finish(again)
    assert rig.committed() == {0: 3}


def test_outputs_still_queued_when_the_flush_times_out_mean_not_committed(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """The broker away longer than the flush timeout: nothing has failed yet, but nothing was acknowledged either.
    Committing then would lose the outputs if they fail later (librdkafka retries them for minutes)."""
    delivery = DeliveryTracker()
    stuck = make_producer(nowhere(rig.s), on_delivery=delivery,
                          **{**LOSES, "message.timeout.ms": 60_000})  # fails long after the flush gave up
    committer = BatchCommitter(rig.consumer, stuck, delivery, rig.dlq, "test", 1.0)
    batch = rig.batch(3)
    stuck.produce(rig.out, b"queued")
    with caplog.at_level(logging.WARNING, logger="pipeline.adapters.batches"):
        assert not committer.finish(batch)
    assert "1 still queued after 1 s" in caplog.text
    assert rig.committed()[0] < 0, "a batch whose output was still queued was committed"
    assert offsets(rig.batch(3)) == [0, 1, 2], "the batch is read again"
    stuck.purge()


def test_dead_letters_not_delivered_mean_not_committed(rig: Rig) -> None:
    lose_dead_letters(rig.dlq, rig.s)
    batch = rig.batch(2)
    rig.producer.produce(rig.out, b"an output that is delivered")
    dead_letter(rig.dlq, rig.source)
    assert not rig.committer.finish(batch)
    assert rig.committed()[0] < 0
    assert offsets(rig.batch(2)) == [0, 1], "the batch is read again"


def test_settle_waits_for_the_outputs_then_commits_asynchronously(rig: Rig) -> None:
    lane = BatchCommitter(rig.consumer, rig.producer, rig.delivery, rig.dlq, "test", 30.0, asynchronous=True)
    batch = rig.batch(3)
    for _ in range(2000):
        rig.producer.produce(rig.out, b"x" * 100)
    settled = lane.settle(batch)
    deadline = time.monotonic() + 30
    while settled is None and time.monotonic() < deadline:
        time.sleep(0.01)
        settled = lane.settle(batch)
    assert settled is True
    deadline = time.monotonic() + 30
    while rig.committed()[0] != 3 and time.monotonic() < deadline:
        rig.consumer.poll(0.1)  # serves the asynchronous commit's callback
    assert rig.committed() == {0: 3}


def test_a_transaction_aborts_and_rewinds_on_a_lost_dead_letter_else_commits_the_offsets(
        settings_factory: Callable[..., Settings]) -> None:
    s = settings_factory(partitions=1)
    topics = topics_of(s)
    produce_all(s, topics.requests, [b"r%d" % i for i in range(4)])
    consumer = make_member(s, f"test-committer-{uuid.uuid4().hex[:8]}")
    consumer.subscribe([topics.requests])
    delivery = DeliveryTracker()
    producer = make_producer(s, on_delivery=delivery, **{"transactional.id": f"test-tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    dlq = DeadLetters(s, "test")
    good_dlq = dlq.producer
    lose_dead_letters(dlq, s)
    committer = BatchCommitter(consumer, producer, delivery, dlq, "test", 30.0, transactional=True)
    rig = Rig(s, topics.requests, topics.results, consumer, producer, delivery, dlq, committer)
    try:
        batch = rig.batch(2)
        producer.begin_transaction()
        producer.produce(topics.results, b"out")
        dead_letter(dlq, topics.requests)
        assert not committer.finish(batch)
        assert rig.committed()[0] < 0
        again = rig.batch(2)
        assert offsets(again) == [0, 1], "the aborted batch is read again"
        dlq.producer = good_dlq
        producer.begin_transaction()
        producer.produce(topics.results, b"out")
        assert committer.finish(again)
        assert rig.committed() == {0: 2}
    finally:
        consumer.close()

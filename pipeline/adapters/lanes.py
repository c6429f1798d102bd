"""The backfill lane of ingest and the workers: its consumer config and the lane itself (its commits: `batches`).

Records on `tierflow.replay` (and the tier topics' backfill share) are read only with the capacity live
traffic leaves free; `pipeline.core.backfill.BackfillGate` decides when.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Message, Producer

from pipeline.adapters.batches import BatchCommitter
from pipeline.adapters.dlq import DeadLetters
from pipeline.adapters.kafka import DeliveryTracker, make_member, make_output_producer, make_producer
from pipeline.core.backfill import BackfillGate
from pipeline.settings import Settings

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the backfill path's pacing
def backfill_consumer_config(settings: Settings) -> dict[str, Any]:
    """librdkafka keys for the consumers of the backfill topics (ingest's and the workers').

    A consumer tailing a busy topic fetches again as soon as a fetch returns, a few records at a time:
    on a small broker that request rate is what slows live produces and fetches. Keeping one record
    queued stops the prefetch until the loop takes its next backfill batch, so a backfill costs a fetch
    per batch; idle, the long wait keeps its polling cheap.
    """
    wait = settings.replay.fetch_wait_ms
    return {"fetch.wait.max.ms": wait, "queued.min.messages": 1, "fetch.queue.backoff.ms": wait}


class BackfillLane:
    """The backfill side of an ingest or worker loop: its consumer, producer and gate, and its batch in flight.

    A backfill batch is produced without waiting for the broker; its offsets commit (asynchronously) once
    its records are acknowledged, checked at the next turn, and a batch that failed is read again. So a
    turn holds the loop only for its CPU time, a live flush never waits for backfill records (they have a
    producer of their own), and at most one backfill batch is in flight. With transactions, each turn is
    a transaction of its own instead (the backfill producer has its own transactional id).
    """

    def __init__(self, settings: Settings, group: str, topic: str, who: str, dlq: DeadLetters,
                 transactional_id: str | None = None, output: bool = False) -> None:
        self.s, self.topic, self.who, self.dlq = settings, topic, who, dlq
        # Idle, it looks at its topic's end as often as its fetches would wait on a broker that holds them.
        self.consumer: Consumer = make_member(settings, group, rest_max_ms=settings.replay.fetch_wait_ms,
                                              **backfill_consumer_config(settings))
        self.delivery = DeliveryTracker()
        extra = {"transactional.id": transactional_id} if transactional_id else {}
        make = make_output_producer if output else make_producer
        self.producer: Producer = make(settings, on_delivery=self.delivery, **{"delivery.report.only.error": True},
                                       **extra)
        self.transactional = transactional_id is not None
        # Each turn commits on its own, asynchronously; with transactions, each turn is one.
        self.committer = BatchCommitter(self.consumer, self.producer, self.delivery, dlq, who,
                                        settings.flush_timeout_s, transactional=self.transactional,
                                        asynchronous=True, what="replayed records", again="re-reading the batch")
        self.gate = BackfillGate(settings.replay.duty, settings.replay.gap_ms / 1000.0)
        self.batch = settings.replay.batch
        self.pending: list[Message] = []

    def start(self) -> None:
        if self.transactional:
            self.producer.init_transactions(30)
        self.consumer.subscribe([self.topic])

    def settled(self) -> bool:
        """Whether the batch in flight is done with: acknowledged (offsets committed) or failed (to be re-read)."""
        if not self.pending:
            return True
        if self.committer.settle(self.pending) is None:
            return False
        self.pending = []
        return True

    def turn(self, live_waiting: bool, process: Callable[[list[Message], Producer], None]) -> int:
        """Take and process one backfill batch, if one is due (see BackfillGate). Returns its size."""
        if not self.gate.due(live_waiting) or not self.settled():
            return 0
        started = self.gate.now()
        msgs = [m for m in self.consumer.consume(self.batch, 0) if m.error() is None]
        if msgs:
            if self.transactional:
                self.producer.begin_transaction()
                process(msgs, self.producer)
                self.committer.finish(msgs)
            else:
                process(msgs, self.producer)
                self.producer.poll(0)
                # Dead letters are rare: wait for them here, so the async commit never outruns one.
                if self.dlq.flush(self.s.flush_timeout_s):
                    self.pending = msgs
                else:
                    log.warning("%s: dead letters of a backfill batch not delivered; re-reading it", self.who)
                    self.committer.discard(msgs)
        self.gate.done(started, len(msgs))
        return len(msgs)

    def idle_wait_s(self, idle_s: float) -> float:
        return self.gate.idle_wait_s(idle_s)

    def close(self) -> None:
        self.producer.flush(self.s.flush_timeout_s)
        self.settled()
        self.consumer.close()


# --------------------------------------------------------------------------- time and positions

"""The one commit path of tierflow's consumers: a batch's offsets are committed only once every record produced
for it (its outputs and its dead letters) was acknowledged; otherwise the consumer is rewound to the batch and
reads it again.

Ingest's live loop, the workers' live loop and both backfill lanes go through `BatchCommitter`, each with the
commit it had: synchronous (live), asynchronous (backfill: see `BackfillLane`), or a transaction (the workers'
`exactly_once`). It runs once per batch, never per message.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException, Message, Producer

from pipeline.adapters.dlq import DeadLetters
from pipeline.adapters.kafka import DeliveryTracker, commit, next_offsets, rewind

log = logging.getLogger(__name__)

BACKOFF_S = 0.5  # after a live batch was not delivered: the broker is in trouble, don't spin on it


def commit_async(consumer: Consumer, msgs: list[Message]) -> None:
    """Commit the offsets after `msgs` without waiting for the broker (backfill batches: see BackfillGate)."""
    if not msgs:
        return
    try:
        consumer.commit(offsets=next_offsets(msgs), asynchronous=True)
    except KafkaException as e:  # not committed: the batch is re-read, and answered ids are not answered again
        log.debug("backfill commit failed: %s", e)


class BatchCommitter:
    """Flush, then commit or rewind, for one consumer and the producer that writes its batches' outputs.

    `delivery` is the producer's delivery tracker; `dlq` the agent's dead letters, flushed first (a dead letter
    is never lost to a commit). `who` names the loop in logs and broker-error metrics; `what` and `again` word
    the warning of a batch that was not delivered. `asynchronous`: commit without waiting for the broker.
    `transactional`: the producer's transaction (begun by the caller) carries the offsets instead.
    """

    def __init__(self, consumer: Consumer, producer: Producer, delivery: DeliveryTracker, dlq: DeadLetters,
                 who: str, flush_timeout_s: float, *, transactional: bool = False, asynchronous: bool = False,
                 what: str = "records", again: str = "re-processing the batch") -> None:
        self.consumer, self.producer, self.delivery, self.dlq = consumer, producer, delivery, dlq
        self.who, self.flush_timeout_s = who, flush_timeout_s
        self.transactional, self.asynchronous = transactional, asynchronous
        self.what, self.again = what, again

    def finish(self, msgs: list[Message]) -> bool:
        """Wait for `msgs`' dead letters and outputs, then commit the offsets after them (True), or rewind the
        consumer to their first offsets and back off 0.5 s (False: the batch is read again).

        True also when the group rejected the commit (logged and counted by `kafka.commit`): the outputs were
        delivered, and whoever owns the partitions next re-reads the batch. With a transaction: aborted and
        rewound when a dead letter was not delivered, else committed with the offsets.
        """
        dead_ok = self.dlq.flush(self.flush_timeout_s)
        if self.transactional:
            if not dead_ok:
                self.producer.abort_transaction()
                rewind(self.consumer, msgs)
                return False
            self.producer.send_offsets_to_transaction(next_offsets(msgs), self.consumer.consumer_group_metadata())
            self.producer.commit_transaction()
            return True
        # Still queued after the timeout (the broker away longer than flush_timeout_s) is not delivered: committing
        # would lose those records if they fail later. Rewound, they may be written twice; never lost.
        left = self.producer.flush(self.flush_timeout_s)
        return self._commit_or_rewind(msgs, dead_ok, BACKOFF_S, left)

    def settle(self, msgs: list[Message]) -> bool | None:
        """`finish` without waiting, for a batch whose dead letters were already flushed: None while any of its
        outputs is still in flight; then committed (True) or rewound (False), with no back-off."""
        self.producer.poll(0)
        if len(self.producer):
            return None
        return self._commit_or_rewind(msgs, True, 0.0)

    def discard(self, msgs: list[Message]) -> None:
        """Give a batch up to read it again: wait out its outputs, forget their failures, rewind to it."""
        self.producer.flush(self.flush_timeout_s)
        self.delivery.reset()
        rewind(self.consumer, msgs)

    def _commit_or_rewind(self, msgs: list[Message], dead_ok: bool, backoff_s: float, left: int = 0) -> bool:
        if self.delivery.failed or not dead_ok or left:
            log.warning("%s: %d %s not delivered (%s)%s%s; %s", self.who, self.delivery.failed, self.what,
                        "; ".join(self.delivery.errors), "" if dead_ok else ", dead letters not delivered",
                        f", {left} still queued after {self.flush_timeout_s:g} s" if left else "", self.again)
            self.delivery.reset()
            rewind(self.consumer, msgs)
            if backoff_s:
                time.sleep(backoff_s)
            return False
        if self.asynchronous:
            commit_async(self.consumer, msgs)
        else:
            commit(self.consumer, msgs, self.who)
        return True

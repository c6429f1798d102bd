"""The control topic: where threshold versions, VIPs, learned models and replay progress live durably, so Redis
is a cache that can be rebuilt (`control_cache.py`).

Kafka Streams' state stores and faust's Tables work the same way: the local store is fast, a compacted changelog
is the truth. One partition (one order for every fact); a record per fact (`ControlKeys`), so compaction keeps each
one's latest. Reading it back means reading from the beginning to the end offsets taken at the start.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException

from pipeline.adapters.kafka import Tail, make_producer, topics_of
from pipeline.core.control import ControlState, fold
from pipeline.errors import ServiceUnavailable
from pipeline.settings import Settings


class ControlLog:
    """Writes control facts to the control topic (each write waits for the broker) and reads them all back."""

    def __init__(self, settings: Settings, timeout_s: float = 5.0) -> None:
        self.settings, self.timeout_s = settings, timeout_s
        self.topic = topics_of(settings).control

    def put(self, records: Sequence[tuple[str, bytes | None]]) -> None:
        """Write `(key, value)` records (None: a tombstone) and return once the broker has them all (acks=all).
        Raises ServiceUnavailable when it does not within the timeout."""
        if not records:
            return
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        # A producer per write, gone with it: control writes are rare (a person, a controller decision, a model),
        # and a producer kept by every store would hold broker connections (and retry them) for nothing.
        # No linger: the caller waits on the write.
        producer = make_producer(self.settings, **{"linger.ms": 0, "enable.idempotence": True})
        try:
            for key, value in records:
                producer.produce(self.topic, value, key.encode(), on_delivery=delivered)
        except (KafkaException, BufferError) as e:
            raise ServiceUnavailable(f"cannot write to the control topic {self.topic}: {e}") from None
        left = producer.flush(self.timeout_s)
        del producer
        if errors or left:
            why = errors[0].str() if errors else f"no acknowledgement within {self.timeout_s:g}s"
            hint = " (tierflow topics create)" if errors and errors[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART \
                else ""
            raise ServiceUnavailable(f"the control topic {self.topic} did not take {len(records)} record(s): "
                                     f"{why}{hint}")

    def read(self) -> ControlState:
        """Every fact on the topic, folded (ServiceUnavailable when the broker or the topic is not there)."""
        tail = Tail(self.settings, self.topic, start="beginning", timeout=self.timeout_s)
        records: list[tuple[bytes | str | None, bytes | None]] = []
        deadline = time.monotonic() + self.timeout_s
        try:
            while not tail.caught_up:
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(f"the control topic {self.topic} was not read to its end within "
                                             f"{self.timeout_s:g}s")
                records += [(m.key(), m.value()) for m in tail.poll(0.1)]
        finally:
            tail.close()
        return fold(records)

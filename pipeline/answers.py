"""Reading answers as a user would: one answer per request id, whatever the delivery guarantees.

Workers deliver at least once, so after a crash an answer can appear twice on `tierflow.answers`.
`AnswerReader` drops repeats by request id (a bounded memory of recent ids), which is the documented
way to consume answers exactly once.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterator

import orjson
from confluent_kafka import Consumer

from pipeline.kafka import make_consumer, topics_of
from pipeline.settings import Settings


class Deduper:
    """Remembers the last `capacity` ids; `first(id)` is True only the first time an id is seen."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.duplicates = 0

    def first(self, key: str) -> bool:
        if key in self._seen:
            self.duplicates += 1
            return False
        self._seen[key] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True


class AnswerReader:
    """Iterate over answers (dicts of schemas/answer.v1.json), each request id once."""

    def __init__(self, settings: Settings, group: str | None = None, from_beginning: bool = True,
                 dedupe: bool = True) -> None:
        self.topic = topics_of(settings).answers
        self.consumer: Consumer = make_consumer(
            settings, group or f"tierflow-answers-{uuid.uuid4().hex[:8]}",
            **{"auto.offset.reset": "earliest" if from_beginning else "latest", "enable.auto.commit": True,
               "enable.auto.offset.store": True},
        )
        self.consumer.subscribe([self.topic])
        self.deduper = Deduper() if dedupe else None

    def poll(self, timeout: float = 0.5, max_records: int = 500) -> list[dict[str, object]]:
        out = []
        for msg in self.consumer.consume(max_records, timeout):
            value = msg.value()
            if msg.error() is not None or value is None:
                continue
            try:
                ans = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            if self.deduper is None or self.deduper.first(str(ans.get("request_id"))):
                out.append(ans)
        return out

    def __iter__(self) -> Iterator[dict[str, object]]:
        while True:
            yield from self.poll()

    def close(self) -> None:
        self.consumer.close()

"""Reading answers as a user would: one answer per request id, whatever the delivery guarantees.

Workers deliver at least once, so after a crash an answer can appear twice on `tierflow.answers`.
`AnswerReader` drops repeats by request id (a bounded memory of recent ids), which is the documented
way to consume answers exactly once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from pipeline.adapters.kafka import Tail, topics_of
from pipeline.contracts.records import Answer, answer_of
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
    """Answers (dicts of schemas/answer.v1.json), each request id once, from positions taken when it is made.

    `from_beginning=False` starts at the topic's end offsets *now*: make the reader, then send, and no answer
    can slip past it. No consumer group is joined or left behind (pipeline.adapters.kafka.Tail).
    """

    def __init__(self, settings: Settings, from_beginning: bool = True, dedupe: bool = True) -> None:
        self.tail = Tail(settings, topics_of(settings).answers, "beginning" if from_beginning else "end")
        self.deduper = Deduper() if dedupe else None

    def poll(self, timeout: float = 0.5, max_records: int = 500) -> list[Answer]:
        out = []
        for msg in self.tail.poll(timeout, max_records):
            ans = answer_of(msg.value())
            if ans is None:
                continue
            if self.deduper is None or self.deduper.first(str(ans.get("request_id"))):
                out.append(ans)
        return out

    @property
    def caught_up(self) -> bool:
        """True once every answer that existed when the reader was made has been read."""
        return self.tail.caught_up

    def __iter__(self) -> Iterator[Answer]:
        while True:
            yield from self.poll()

    def close(self) -> None:
        self.tail.close()

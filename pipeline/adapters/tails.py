"""Reading answers (and hand-overs) as a user would: one per request id, whatever the delivery guarantees.

Workers deliver at least once, so after a crash an answer can appear twice on `tierflow.answers`.
`AnswerReader` drops repeats by request id (a bounded memory of recent ids), which is the documented
way to consume answers exactly once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from pipeline.adapters.kafka import Tail, topics_of
from pipeline.contracts.records import Answer, Handover, answer_of, handover_of
from pipeline.settings import Settings

R = TypeVar("R", Answer, Handover)


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


class RecordReader(Generic[R]):
    """Records of one topic read by `read` (None: skipped), each request id once, from positions taken when it is
    made.

    `from_beginning=False` starts at the topic's end offsets *now*: make the reader, then send, and no record can
    slip past it. No consumer group is joined or left behind (pipeline.adapters.kafka.Tail). `listen`: wake on the
    workers' ring (a reader that follows the topic; a one-shot command is done before its doorbell could subscribe).
    """

    def __init__(self, settings: Settings, topic: str, read: Callable[[bytes | None], R | None],
                 from_beginning: bool = True, dedupe: bool = True, listen: bool = False) -> None:
        self.tail = Tail(settings, topic, "beginning" if from_beginning else "end", listen=listen)
        self.read: Callable[[bytes | None], R | None] = read
        self.deduper = Deduper() if dedupe else None

    def poll(self, timeout: float = 0.5, max_records: int = 500) -> list[R]:
        out = []
        for msg in self.tail.poll(timeout, max_records):
            rec = self.read(msg.value())
            if rec is None:
                continue
            if self.deduper is None or self.deduper.first(str(rec.get("request_id"))):
                out.append(rec)
        return out

    @property
    def caught_up(self) -> bool:
        """True once every record that existed when the reader was made has been read."""
        return self.tail.caught_up

    def __iter__(self) -> Iterator[R]:
        while True:
            yield from self.poll()

    def close(self) -> None:
        self.tail.close()


class AnswerReader(RecordReader[Answer]):
    """Answers (dicts of schemas/answer.v1.json) on tierflow.answers, each request id once."""

    def __init__(self, settings: Settings, from_beginning: bool = True, dedupe: bool = True,
                 listen: bool = False) -> None:
        super().__init__(settings, topics_of(settings).answers, answer_of, from_beginning, dedupe, listen)


class HandoverReader(RecordReader[Handover]):
    """Hand-overs (schemas/handover.v1.json) on tierflow.handover, each request id once: a human agents' desk."""

    def __init__(self, settings: Settings, from_beginning: bool = True, dedupe: bool = True,
                 listen: bool = False) -> None:
        super().__init__(settings, topics_of(settings).handover, handover_of, from_beginning, dedupe, listen)

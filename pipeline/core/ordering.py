"""Reading a partition in offset order from a broker that may show a later record before an earlier one.

Kafka makes a partition's records visible in offset order, so a consumer that reads offset n+2 after n never
meets n+1 later. tansu, with several producers writing one partition, can answer a fetch at the log's end with
a later batch before an earlier one is stored: the consumer moves past records it would find on a second read
(measured: bench/ordering.py). `GapGuard` decides, per record, whether to deliver it or to hold it back and
re-read its partition from the offset expected next; the consumer that asks it does the I/O
(pipeline/adapters/kafka.py `OrderedConsumer`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

Partition = tuple[str, int]  # (topic, partition)


@dataclass
class GapGuard:
    """Per partition: the offset expected next, and the gap being waited out.

    A record past the expected offset is held back (`admit` answers where to re-read from) until the missing
    offsets appear or `grace_s` passes with the same gap: then it is a real one (a transaction marker, a write
    the broker gave up on) and the record goes through. A record at or before the expected offset goes through
    at once: the caller moved back (a rewind), which the guard follows.
    """

    grace_s: float = 2.0
    healed: int = 0  # gaps filled in by a re-read: records a plain consumer would have skipped
    passed: int = 0  # gaps that stayed: delivered past after grace_s
    _next: dict[Partition, int] = field(default_factory=dict)
    _gap: dict[Partition, tuple[int, int, float]] = field(default_factory=dict)  # (expected, seen, since)

    def admit(self, tp: Partition, offset: int, now: float) -> int | None:
        """None: deliver the record at `offset`. An offset: hold it (and the rest of `tp` in hand) back, and
        read `tp` again from there."""
        want = self._next.get(tp)
        if want is not None and offset > want:
            gap = self._gap.get(tp)
            if gap is None or gap[:2] != (want, offset):
                self._gap[tp] = gap = (want, offset, now)
            if now - gap[2] < self.grace_s:
                return want
            self.passed += 1
        elif tp in self._gap:
            self.healed += 1
        self._gap.pop(tp, None)
        self._next[tp] = offset + 1
        return None

    def forget(self, tps: Iterable[Partition] | None = None) -> None:
        """Start over for `tps` (all when None): they were assigned again or moved by a seek."""
        if tps is None:
            self._next.clear()
            self._gap.clear()
            return
        for tp in tps:
            self._next.pop(tp, None)
            self._gap.pop(tp, None)

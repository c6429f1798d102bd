"""When a consumer may fetch, on a broker that answers an empty fetch at once. Pure: times are passed in.

Kafka holds an empty fetch up to `fetch.wait.max.ms` and answers the moment a record arrives, so a waiting
librdkafka consumer costs nothing. A broker that answers at once (the embedded noida) turns each consumer's fetcher
into a busy loop whenever it has caught up: measured, one such consumer and the broker's side of it took a whole
core, and an idle `tierflow up` both cores of a 2-core machine. So the consumer paces itself: while records flow it
fetches freely (`hot`); after `rest_after_s` without any it pauses its partitions (no fetches at all) and asks the
broker for the log's end instead, one cheap request (a ListOffsets costs ~0.16 ms of CPU, both sides) at intervals
doubling from `first_s` up to `max_s`; records past its position wake it. Every `recheck_s` it looks regardless,
whatever the ends said (a safety net: a record is late by at most that, never lost, since pausing and resuming keep
the position).

A woken consumer stays hot until records come (`expect`), up to `hold_s`: a probe that found records behind
resumes the partitions, and the fetch that brings them back can take longer than `rest_after_s` (librdkafka backs
a fetch off by `fetch.queue.backoff.ms` after a full queue: 200 ms on the backfill lanes). Resting again before it
returned dropped it, and the next probe woke the consumer for the same records: measured, a backfill lane resting
2 ms after its batches delivered 31 of 3,000 records in 20 s, one probe-wake-rest cycle after another
(tests/integration/test_ordered_consumer.py). And where a paused partition resumes when nothing was delivered from
it yet is its committed offset, or the reset point: not the end its last fetch saw, which a fetch dropped by the
pause may already be past.

With those two, resting is safe under load too, so a consumer rests 5 ms after its last record (it was 500 ms,
idle only), and at once when the application goes away with a batch for longer than a rest on average (`away`:
a heavy worker's model; its fetcher looped the whole time). At 50 msg/s through `tierflow up` (20 s, 1,000
shop messages): CPU per answer 34.8 -> 16.1 ms, the broker's share 39% -> 12% of a core, p95 2.0 s -> 60 ms (the
fetch loops had starved the heavy tier's model); p50 6.5 -> 20 ms, since a record from a producer that does not
ring waits for the next look (the doubling from `first_s`).

Then the load itself sets the pace. Where records come further apart than `rest_after_s`, a consumer rests
`sparse_rest_s` after each (the next is a ring or a look away anyway), and while they keep coming its looks stay
within a quarter of their gap instead of doubling. With the workers ringing the answers topic too, at 50 msg/s
(20 s, 1,000 shop messages): CPU per answer 16.9 -> 12.9 ms, p50 19.0 -> 8.4 ms, p99 66 -> 45 ms.

Counted with strace at 50 msg/s, each light record still cost its worker 12 fetches and 4.4 ListOffsets: the
fetcher looped while the worker predicted, produced and committed (1-3 ms, "away", longer than a sparse rest), and
looks came every few ms between records. So a consumer rests as it goes away for longer than it would stay hot
(`away_long`), and where every writer rings (`rung`: the tier topics) it looks only every `max_s`: 3.5 fetches and
2.3 ListOffsets a record; the whole stack's CPU per answer 11.4-12.7 -> 8.3-9.4 ms, runs interleaved (2026-12-07).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TP = tuple[str, int]
STEADY_GAPS = 4.0  # records count as still coming while the last is no older than this many of their gaps
GAP_CAP_S = 1.0  # a longer gap counts as this much: after an idle hour, a new stream's pace is learnt in a few records


@dataclass
class FetchPacer:
    """The hot/resting state of one consumer and when its next probe of the log's end is due."""

    rest_after_s: float = 0.005
    sparse_rest_s: float = 0.0005
    first_s: float = 0.004
    max_s: float = 0.1
    recheck_s: float = 2.0
    hold_s: float = 2.0
    rung: bool = False  # every writer of the topics rings their doorbell: a probe is only a safety net

    def __post_init__(self) -> None:
        self.resting = False
        self._last_data = 0.0  # the last time records arrived (or the consumer woke)
        self._arrived: float | None = None  # the last time records arrived
        self._gap_s: float | None = None  # time between arrivals (moving average)
        self._expect_until = 0.0  # records are known to be behind: hot until they come, or until then
        self._away_at: float | None = None
        self._away_s: float | None = None  # how long the application stays away after records (moving average)
        self._interval = self.first_s
        self._next_probe = 0.0
        self._recheck_at = 0.0

    def got(self, now: float, records: bool = True) -> None:
        """Records arrived (`records`; else something says the consumer should be awake): stay hot from `now`."""
        if records:
            if self._arrived is not None:
                gap = min(now - self._arrived, GAP_CAP_S)
                self._gap_s = gap if self._gap_s is None else 0.7 * self._gap_s + 0.3 * gap
            self._arrived = now
        self.resting = False
        self._last_data = now
        self._expect_until = 0.0

    def expect(self, now: float) -> None:
        """Woken for records known to be there: stay hot until they arrive (`got`), at most `hold_s`."""
        self.got(now, records=False)
        self._expect_until = now + self.hold_s

    def hot_window_s(self) -> float:
        """How long to stay hot after records: `rest_after_s` while they come closer together than that (the next
        is likely within it, and a fetch is cheaper than a rest and a wake), else `sparse_rest_s`: the next record
        is a ring or a probe away anyway, and every millisecond hot is a fetch loop on both sides."""
        sparse = self._gap_s is not None and self._gap_s > self.rest_after_s
        return self.sparse_rest_s if sparse else self.rest_after_s

    def _hot_until(self) -> float:
        return max(self._last_data + self.hot_window_s(), self._expect_until)

    def should_rest(self, now: float) -> bool:
        return not self.resting and now >= self._hot_until()

    def hot_left_s(self, now: float) -> float:
        """How long a hot consumer may still wait for records before it rests (0 when resting)."""
        return 0.0 if self.resting else max(0.0, self._hot_until() - now)

    def rest(self, now: float) -> None:
        """Rest from `now`: the first look in `first_s`, or where every writer rings (`rung`) in `max_s`."""
        self.resting = True
        self._interval = self._first_interval()
        self._next_probe = now + self._interval
        self._recheck_at = now + self.recheck_s

    def _first_interval(self) -> float:
        return self.max_s if self.rung else self.first_s

    def away(self, now: float) -> None:
        """The application goes away with its records (a model's batch)."""
        self._away_at = now

    def called(self, now: float) -> None:
        """The application asks again: how long it was away feeds `away_long`."""
        if self._away_at is not None:
            away = now - self._away_at
            self._away_s = away if self._away_s is None else 0.8 * self._away_s + 0.2 * away
            self._away_at = None

    def away_long(self) -> bool:
        """Whether the application typically stays away with its records longer than it would stay hot after them
        (`hot_window_s`: a model's inference; or, where records come further apart than `rest_after_s`, a light
        worker's predict, produce and commit of each): the fetcher would loop that whole time, so the consumer
        rests as it goes."""
        return self._away_s is not None and self._away_s > self.hot_window_s()

    def soon(self, now: float) -> None:
        """Something may have been written (a ring for another member's partition, say): probe again from
        `first_s` (`rung`: the next write rings again)."""
        if self.resting:
            self._interval = self._first_interval()
            self._next_probe = now + self._interval

    def probe_due(self, now: float) -> bool:
        return self.resting and now >= self._next_probe

    def recheck_due(self, now: float) -> bool:
        return now >= self._recheck_at

    def rechecked(self, now: float) -> None:
        """A look at the partitions themselves (not their ends) found nothing: the next in `recheck_s`."""
        self._recheck_at = now + self.recheck_s

    def probed(self, now: float) -> None:
        """A probe found nothing new: the next one waits twice as long, up to `max_s`; while records keep coming
        at a steady pace (the last no longer ago than a few of their gaps), up to a quarter of their gap: at 50
        msg/s the doubling had a record wait 7 ms for ingest's look, against 2-3 ms with looks 5 ms apart. Not where
        the topics are `rung`: a record wakes the consumer by its ring, and the looks (at 50 msg/s four of them
        between two records) only cost both sides a ListOffsets each."""
        self._interval = min(self._interval * 2.0, self.max_s)
        gap, arrived = self._gap_s, self._arrived
        if not self.rung and gap is not None and arrived is not None and now - arrived < STEADY_GAPS * gap:
            self._interval = min(self._interval, max(self.first_s, gap / 4.0))
        self._next_probe = now + self._interval

    def wait_s(self, now: float) -> float:
        """How long until the next probe (0 when one is due or the consumer is hot)."""
        return max(0.0, self._next_probe - now) if self.resting else 0.0


def behind_ends(ends: Mapping[TP, int], starts: Mapping[TP, int | None]) -> bool:
    """Whether any partition's end offset is past where this consumer would read next.

    `starts`: per partition the next offset to deliver (None: unknown, which counts as behind). A partition in
    `ends` missing from `starts` is one assigned since the consumer paused: behind, so it wakes and looks.
    """
    for tp, end in ends.items():
        start = starts.get(tp)
        if start is None or end > start:
            return True
    return False

"""bench.common's answer reader: a run counts only its own answers, waits for all of them, and its
percentiles include every answer (missing ones reported, never dropped). No broker: a fake consumer."""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from bench import common
from bench.article_service import long_share
from bench.common import SHOP_TEXTS as TEXTS


class FakeMessage:
    def __init__(self, key: bytes | None, value: bytes) -> None:
        self._key, self._value = key, value

    def error(self) -> None:
        return None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value


class FakeConsumer:
    """Hands out the queued records a few at a time; records where the reader was assigned."""

    def __init__(self, records: list[FakeMessage], high: int = 0) -> None:
        self.records = records
        self.high = high
        self.assigned: list[Any] = []
        self.closed = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None, 1: None})})

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 0, self.high

    def assign(self, parts: list[Any]) -> None:
        self.assigned = parts

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        out, self.records = self.records[:min(n, 3)], self.records[min(n, 3):]
        if not out and timeout:
            time.sleep(min(timeout, 0.01))
        return out

    def close(self) -> None:
        self.closed = True


def answers(ids: list[str]) -> list[FakeMessage]:
    return [FakeMessage(i.encode(), b'{"answer": "x"}') for i in ids]


def test_ids_of_an_earlier_run_never_count() -> None:
    # the bug: a reused topic held 10,000 answers of the previous run, so "10,000 read" came at once
    earlier, mine = common.run_ids(10, "old"), common.run_ids(4, "new")
    log = common.AnswerLog(mine)
    for rid in earlier:
        log.note(rid, 1.0)
    assert not log.complete and log.read_at == {} and log.foreign == 10
    for k, rid in enumerate(mine[:3]):
        log.note(rid, 2.0 + k)
    log.note(mine[0], 9.0)  # a re-read keeps the first read time
    assert not log.complete and log.missing() == [mine[3]]
    assert log.read_at[mine[0]] == 2.0
    log.note(mine[3], 5.0)
    assert log.complete and log.missing() == []


def test_run_ids_are_unique_per_run() -> None:
    a, b = common.run_ids(3), common.run_ids(3)
    assert len(set(a)) == 3 and not set(a) & set(b)
    assert common.run_ids(2, "t") == ["t-0", "t-1"]


def test_reader_waits_for_every_expected_answer_past_other_runs() -> None:
    mine = common.run_ids(20, "now")
    fake = FakeConsumer(answers(common.run_ids(50, "before")) + answers(mine[:10])
                        + [FakeMessage(None, orjson.dumps({"request_id": r})) for r in mine[10:]], high=7)
    reader = common.AnswerReader(None, "answers", mine, consumer=fake)  # type: ignore[arg-type]
    reader.start()
    assert [(tp.partition, tp.offset) for tp in fake.assigned] == [(0, 7), (1, 7)]  # from each partition's end
    reader.wait(10)
    reader.stop()
    assert reader.log.complete  # the wait ended on the run's own 20, not on the first 20 records read
    assert len(reader.log.read_at) == 20 and reader.log.foreign == 50
    assert fake.closed


def test_reader_reports_what_did_not_arrive_in_time() -> None:
    mine = common.run_ids(5, "now")
    reader = common.AnswerReader(None, "answers", mine, consumer=FakeConsumer(answers(mine[:3])))  # type: ignore[arg-type]
    reader.start()
    t0 = time.time()
    gave_up = reader.wait(0.3)
    reader.stop()
    assert gave_up - t0 >= 0.3
    run = common.summarize({rid: t0 for rid in mine}, reader.log, t0, gave_up)
    assert (run.sent, run.answered, run.missing) == (5, 3, 2)
    assert run.missing_floor_ms >= 300


def test_summary_keeps_every_answer_in_the_percentiles() -> None:
    sent = {f"r-{i}": 100.0 + i for i in range(100)}
    log = common.AnswerLog(sent)
    for i, rid in enumerate(sent):
        log.note(rid, sent[rid] + (0.010 if i < 95 else 1.0))  # the last five (the tail) are slow
    run = common.summarize(sent, log, 100.0, 300.0)
    assert run.answered == 100 and run.missing == 0
    assert sorted(run.latencies_ms) == pytest.approx([10.0] * 95 + [1000.0] * 5)
    p50, _, p99 = run.percentiles()
    assert p50 == pytest.approx(10.0) and p99 == pytest.approx(1000.0)
    assert run.seconds == pytest.approx(100.0)  # start 100 s, the last answer read at 199 + 1 s
    assert run.cells()[2] == "1000.0"


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_tail_percentiles_without_missing_match_statistics(n: int) -> None:
    xs = [float((i * 37) % 101) for i in range(n)]
    got = common.tail_percentiles(xs, 0, (50, 95, 99))
    want = statistics.quantiles(xs, n=100, method="inclusive") if n > 1 else [xs[0]] * 99
    assert got == pytest.approx([want[49], want[94], want[98]])


def test_a_percentile_among_missing_answers_is_unknown_not_dropped() -> None:
    xs = [float(i) for i in range(1, 99)]  # 98 answered in 1..98 ms, 2 never answered
    p50, p95, p99 = common.tail_percentiles(xs, 2, (50, 95, 99))
    assert p50 == pytest.approx(50.5) and p95 == pytest.approx(95.05)
    assert p99 is None  # dropping the 2 missing would have given 97.03
    run = common.Run(100, 98, 1.0, xs, missing_floor_ms=250.0)
    assert run.cells() == ["50.5", "95.0", "> 250"]
    note = common.missing_note({"echo fixed": run, "bare": common.Run(3, 3, 1.0, [1.0, 2.0, 3.0])})
    assert "echo fixed: 2 of 100 missing" in note and "bare" not in note
    assert common.missing_note({"bare": common.Run(1, 1, 1.0, [1.0])}) == ""


def test_article_share_of_long_texts_is_computed() -> None:
    long, share = long_share(TEXTS, 50)
    assert long == sum(len(t) > 50 for t in TEXTS)
    assert share == pytest.approx(long / len(TEXTS))
    assert long_share(["x" * 51, "y", "z"], 50) == (1, pytest.approx(1 / 3))


def test_article_targets_say_which_are_met() -> None:
    from bench.article_service import Measured, targets

    slow = Measured(rate=100.0, sent=4, latencies_ms=[5.0, 6.0, 7.0, 8.0], accuracy=0.9, cpu_ms=10.0)
    fast = Measured(rate=600.0, sent=4, latencies_ms=[2.0, 3.0, 4.0, 5.0], accuracy=0.95, cpu_ms=1.0)
    text = targets({"torch": (slow, slow), "tierflow": (slow, slow)}, fast, fast)
    assert "**not met**" not in text and "What keeps" not in text
    costly = Measured(rate=600.0, sent=4, latencies_ms=[2.0, 3.0, 4.0, 5.0], accuracy=0.95, cpu_ms=3.0)
    text = targets({"torch": (slow, slow), "tierflow": (slow, slow)}, fast, costly)
    assert "CPU per answer <= 1/5 of the article service's: **not met**" in text and "What keeps" in text

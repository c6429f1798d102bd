"""`tierflow status` on an 80x24 terminal, and with Redis down: a snapshot of the rendered frame (regenerate with
TIERFLOW_UPDATE_SNAPSHOTS=1 after an intended change, and read the diff)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.thresholds import Thresholds
from pipeline.ops.status import DeadLetter, Frame, TierView, render

SNAPSHOTS = Path(__file__).parent / "snapshots"
AT = 1_796_160_000.0  # a fixed instant, shown in UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def frame(redis_up: bool = True) -> Frame:
    def view(tier: str, workers: int, ready: int, models: str, answers: int, p95: float, lag: int, esc: int,
             deg: int, abst: int, handed: int) -> TierView:
        return TierView(tier, workers if redis_up else None, ready if redis_up else None,
                        models if redis_up else "", answers, answers / 10.0, p95,
                        p95 * 0.9 if redis_up else None, lag if redis_up else None, esc, deg, 0.4, abst, handed)

    tiers = [view("light", 2, 2, "charngram@cpu", 1234, 38.0, 12, 151, 0, 42, 0),
             view("heavy", 3, 2, "minilm+smollm2@cuda", 412, 3480.0, 2210, 0, 37, 17, 17),
             view("multimodal", 1, 1, "ocr+charngram@cpu", 25, 212.0, 0, 3, 0, 1, 1)]
    notes = [] if redis_up else ["Redis unreachable at redis://10.0.0.5:6379/0: worker counts, lag and thresholds "
                                 "unknown (Error 111 connecting to 10.0.0.5:6379. Connection refused.)"]
    return Frame(at=AT, window_s=10.0, tiers=tiers, thresholds=Thresholds() if redis_up else None, dlq_rate=0.3,
                 dead_letters=[DeadLetter(int(AT * 1000) - 4000, "schema", "ingest",
                                          "text: Input should be a valid string (2 errors)"),
                               DeadLetter(int(AT * 1000) - 5000, "encoding", "ingest",
                                          "not UTF-8: invalid start byte at byte 0"),
                               DeadLetter(int(AT * 1000) - 6000, "schema", "ingest",
                                          "image.mime: Input should be 'image/png', 'image/jpeg' or 'image/webp'")],
                 source="tierflow-kafka-bootstrap.kafka.svc:9092  redis://10.0.0.5:6379/0  topics tierflow.*",
                 notes=notes)


def shown(f: Frame, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    console.print(render(f, width))
    return console.export_text()


def check(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("TIERFLOW_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}: run with TIERFLOW_UPDATE_SNAPSHOTS=1 and read it"
    assert text == path.read_text(), f"{name} changed; rerun with TIERFLOW_UPDATE_SNAPSHOTS=1 if intended"


@pytest.mark.parametrize("redis_up", [True, False], ids=["healthy", "redis-down"])
def test_status_fits_80_columns_without_cutting_a_value(redis_up: bool) -> None:
    text = shown(frame(redis_up), 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text, "a column was cut"
    for value in ("light", "heavy", "multimodal", "123.4", "3480", "2210" if redis_up else "?"):
        assert value in text, value
    # abstentions and hand-overs per tier, the hand-over share of all answers (and its budget when known)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith(" ") and line.strip()}
    assert rows["heavy"][-3:-1] == ["17", "17"] and rows["all"][-2:] == ["60", "18"]
    assert "handed over 1.1% (18 answers" in text and ("budget 10%" in text) == redis_up
    if redis_up:
        th = Thresholds()
        for key in ("handover_above", "handover_budget", "abstain_above"):
            assert f"{key}={getattr(th, key)}" in text, key
    check(f"status_80_{'healthy' if redis_up else 'redis_down'}.txt", text)


def test_with_redis_down_the_worker_counts_are_unknown_not_zero() -> None:
    text = shown(frame(redis_up=False), 80)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith(" ") and line.strip()}
    assert rows["light"][1] == "?" and rows["heavy"][1] == "?" and rows["all"][1] == "?"
    assert "worker counts, lag and thresholds unknown" in " ".join(text.split())


def test_a_wide_terminal_keeps_the_full_table() -> None:
    text = shown(frame(), 160)
    assert "worker p95" in text and "minilm+smollm2@cuda" in text and "(1 joining)" in text
    assert "handed over" in text and "17 (4%)" in text  # heavy: 17 of its 412 answers
    assert max(len(line) for line in text.splitlines()) <= 160 and "…" not in text


@pytest.mark.parametrize("width", [100, 120, 149, 150, 170, 200])
def test_no_header_is_cut_at_any_common_width(width: int) -> None:
    """Found trying it as a user: at 120 and 160 columns the wide table cut its headers to "an…", "wor…"; only
    the models' names may be shortened."""
    text = shown(frame(), width)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("tier"))
    assert "…" not in header, header
    assert "multimodal" in text


def test_the_writer_line_counts_written_answers_and_templates_sent_instead_by_reason() -> None:
    f = frame()
    heavy = f.tiers[1]
    tiers = [f.tiers[0], TierView(**{**heavy.__dict__, "written": 9, "write_p95_ms": 6200.0,
                                     "fallbacks": {"missing_facts": 2, "empty": 1}}), f.tiers[2]]
    text = shown(Frame(**{**f.__dict__, "tiers": tiers}), 80)
    line = next(ln for ln in text.splitlines() if ln.startswith("writer"))
    assert line.rstrip() == "writer wrote 9 (p95 6.2 s)   templates instead 3: empty 1, missing_facts 2"
    assert not any(ln.startswith("writer") for ln in shown(f, 80).splitlines())  # no writer, no line

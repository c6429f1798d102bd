"""`tierflow report` without a broker: summaries of synthetic result records, and the PNG they draw."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest

from pipeline.ops.report import Summary, final_answers, summarize, write_figure

T0 = 1_780_000_000_000  # epoch ms


def result(rid: str, tier: str, total: float, at: int, *, final: bool = True, intent: str = "card_arrival",
           label: str | None = None, escalated: bool = False, degraded: bool = False,
           shadow: bool = False) -> dict[str, Any]:
    """A result record with the fields the report reads (schemas/result.v1.json)."""
    return {
        "request_id": rid, "user_id": None, "answer": "" if not final else "ok", "intent": intent,
        "confidence": 0.9, "tier": tier, "model": f"{tier}-model", "escalated": escalated, "degraded": degraded,
        "route_reason": "short", "replay": False, "threshold_version": 1, "final": final, "stage": tier,
        "shadow": shadow, "answered_at": at, "label": label, "batch_size": 1, "worker_id": "w",
        "timings_ms": {"ingest": 0.1, "queue": 1.0, "inference": total / 2, "total": total},
        "timestamps": {"received": at - int(total), "ingested": at, "dequeued": at, "inferred": at, "produced": at},
    }


def synthetic_run(n: int = 3000, seconds: int = 60, seed: int = 7) -> list[dict[str, Any]]:
    """A minute of traffic whose heavy share rises over time, with escalations, a degraded spell and
    labels on every other request; light is right 80% of the time, heavy 95%."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        at = T0 + int(i * seconds * 1000 / n)
        progress = i / n
        label = rng.choice(["card_arrival", "lost_card", "refund"]) if i % 2 == 0 else None
        roll = rng.random()
        if i % 150 == 0:
            tier, total = "multimodal", rng.lognormvariate(5.5, 0.3)
        elif roll < 0.15 + 0.4 * progress:
            tier, total = "heavy", rng.lognormvariate(4.5, 0.5)
        else:
            tier, total = "light", rng.lognormvariate(1.5, 0.6)
        right = rng.random() < (0.95 if tier == "heavy" else 0.8)
        intent = label if (label and right) else "other"
        escalated = tier == "heavy" and rng.random() < 0.3
        degraded = tier == "light" and 0.5 < progress < 0.6
        rid = f"r{i}"
        if escalated:  # the light stage that escalated is a non-final record of its own
            out.append(result(rid, "light", 2.0, at - 5, final=False, intent="other", label=label))
        out.append(result(rid, tier, total, at, intent=intent, label=label, escalated=escalated, degraded=degraded))
    return out


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_summary_counts_percentiles_and_accuracy() -> None:
    results = [
        result("a", "light", 10, T0, label="x", intent="x"),
        result("b", "light", 20, T0 + 1000, label="x", intent="y"),
        result("c", "light", 30, T0 + 2000),
        result("d", "heavy", 400, T0 + 3000, escalated=True, intent="z"),
        result("d", "light", 3, T0 + 2500, final=False),  # d's light stage, escalated
        result("e", "multimodal", 900, T0 + 4000, degraded=False),
        result("f", "light", 5, T0 + 5000, degraded=True),
        result("s", "heavy", 50, T0 + 5500, final=False, shadow=True),
        result("a", "light", 10, T0 + 6000, label="x", intent="x"),  # a repeat (at-least-once)
    ]
    s = summarize(results, {"d": "z", "e": "refund"}, dlq=["not_json", "schema", "not_json"], heavy_budget=0.25)

    assert s.results == 9 and s.answers == 6 and s.duplicates == 1 and s.shadow == 1
    assert {t: st.answers for t, st in s.tiers.items()} == {"light": 4, "heavy": 1, "multimodal": 1}
    assert s.heavy_share == pytest.approx(1 / 6)
    assert s.escalated == 1 and s.escalation_rate == pytest.approx(1 / 6)
    assert s.degraded == 1
    assert s.dlq == {"not_json": 2, "schema": 1} and s.dlq_total == 3
    light = s.tiers["light"]
    assert light.p50_ms == pytest.approx(15.0)  # 5, 10, 20, 30
    assert light.p99_ms <= 30 and light.p95_ms > 20
    # labels topic wins over the request's own label; unlabelled answers don't count
    assert (light.labelled, light.correct, light.accuracy) == (2, 1, 0.5)
    assert s.tiers["heavy"].accuracy == 1.0 and s.tiers["multimodal"].accuracy == 0.0
    assert s.overall.labelled == 4 and s.overall.accuracy == pytest.approx(0.5)
    assert s.first_ms == T0 and s.last_ms == T0 + 5000 and s.duration_s == 5.0


def test_summary_text_reads_well() -> None:
    s = summarize(synthetic_run(600, 30), {}, dlq=["bad_image"] * 2 + ["not_json"], heavy_budget=0.25)
    text = s.text()
    lines = text.splitlines()
    assert lines[0].startswith("tierflow report") and "UTC" in lines[0]
    for tier in ("light", "heavy", "multimodal", "all"):
        assert any(line.startswith(tier) for line in lines), tier
    assert "heavy share" in text and "(budget 25.0%)" in text
    assert "dead letters 3 (bad_image 2, not_json 1)" in text
    assert max(len(line) for line in lines) <= 100


def test_abstentions_and_hand_overs_per_tier_and_apart_from_accuracy(tmp_path: Path) -> None:
    def oos(r: dict[str, Any], *, handover: str | None = None) -> dict[str, Any]:
        r = {**r, "oos_score": 0.9, "abstained": True}
        if handover is not None:
            r.update(handover=True, handover_reason=handover, answer="A colleague will get back to you shortly.")
        return r

    results = [
        result("a", "light", 10, T0, label="x", intent="x"),
        result("b", "light", 10, T0 + 100, label="x", intent="y"),
        oos(result("c", "light", 3, T0 + 150, final=False)),  # light abstained: escalated
        oos(result("c", "heavy", 400, T0 + 200, escalated=True, label="x", intent="x"), handover="out_of_scope"),
        oos(result("d", "light", 3, T0 + 250, final=False)),
        oos(result("d", "heavy", 400, T0 + 300, escalated=True, label="x", intent="z"), handover="out_of_scope"),
        oos(result("e", "multimodal", 900, T0 + 400), handover="unreadable"),
        oos(result("d", "light", 3, T0 + 250, final=False)),  # a repeat of d's light stage: counted once
        oos(result("s", "heavy", 50, T0 + 500, final=False, shadow=True)),  # a shadow answers nobody
        result("f", "heavy", 300, T0 + 600, label="x", intent="x"),
    ]
    s = summarize(results, {}, handover_budget=0.1)
    assert s.abstained == {"light": 2, "heavy": 2, "multimodal": 1}
    assert s.handovers == {"heavy": {"out_of_scope": 2}, "multimodal": {"unreadable": 1}}
    assert s.handover_total == 3 and s.handover_share == pytest.approx(3 / 6)
    # accuracy is of the answers the models gave: the two labelled hand-overs are neither right nor wrong
    heavy = s.tiers["heavy"]
    assert heavy.answers == 3 and (heavy.labelled, heavy.correct, heavy.accuracy) == (1, 1, 1.0)
    assert (heavy.handed_over, heavy.handed_over_matched) == (2, 1)
    assert (s.overall.labelled, s.overall.correct, s.overall.handed_over) == (3, 2, 2)
    text = s.text()
    assert "abstained   5 (light 2, heavy 2, multimodal 1)" in text
    assert ("handed over 3 (50.0% of answers; budget 10.0%)  OVER BUDGET: heavy out_of_scope 2, multimodal "
            "unreadable 1") in text
    assert "not in accuracy (a person answers them): 2 labelled, the model's nearest intent was the label in 1" in text
    assert max(len(line) for line in text.splitlines()) <= 120
    assert write_figure(s, results, {}, tmp_path / "handed.png").stat().st_size > 20_000  # with their own line


def test_records_from_before_hand_overs_count_none() -> None:
    s = summarize(synthetic_run(300, 10), {})
    assert s.abstained == {} and s.handovers == {} and s.handover_share == 0.0
    assert "handed over 0 (0.0% of answers)" in s.text() and "not in accuracy" not in s.text()


def test_empty_run() -> None:
    s = summarize([], {})
    assert s.answers == 0 and s.heavy_share == 0.0 and s.escalation_rate == 0.0 and s.overall.accuracy is None
    assert "no answers" in s.text()


def test_final_answers_keep_first_and_sort_by_time() -> None:
    rs = [result("b", "light", 1, T0 + 10), result("a", "heavy", 1, T0), result("b", "heavy", 1, T0 + 20)]
    finals, repeats = final_answers(rs)
    assert [(r["request_id"], r["tier"]) for r in finals] == [("a", "heavy"), ("b", "light")] and repeats == 1


def test_png_written_and_readable(tmp_path: Path) -> None:
    results = synthetic_run()
    s = summarize(results, {}, dlq=["not_json"] * 4, heavy_budget=0.3)
    dlq_times = [T0 + 5_000, T0 + 5_300, T0 + 40_000, T0 + 41_000]
    path = write_figure(s, results, {}, tmp_path / "out" / "report.png", dlq_times)
    assert path.stat().st_size > 20_000
    width, height = png_size(path)
    assert 1000 <= width <= 3000 and 700 <= height <= 2000 and width > height


def test_png_without_answers_or_labels(tmp_path: Path) -> None:
    empty = write_figure(summarize([], {}), [], {}, tmp_path / "empty.png")
    assert png_size(empty)[0] >= 1000
    # one instant of traffic, nothing labelled: degenerate windows and bins must still draw
    one = [result("a", "light", 0, T0), result("b", "heavy", 0, T0)]
    path = write_figure(summarize(one, {}), one, {}, tmp_path / "one.png")
    assert path.stat().st_size > 20_000


def test_summary_is_a_value() -> None:
    s = summarize(synthetic_run(100, 5), {})
    assert isinstance(s, Summary)
    with pytest.raises(AttributeError):
        s.answers = 0  # type: ignore[misc]

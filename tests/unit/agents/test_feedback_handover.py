"""The feedback agent's side of hand-overs (issue 20), without a broker or Redis: the share gauge it owns, the
thresholds it exports, and a hand-over move that leaves the change under watch its own count."""

from __future__ import annotations

from typing import Any, cast

import orjson
from prometheus_client import REGISTRY

from pipeline import metrics
from pipeline.agents.feedback import Feedback, TickResult
from pipeline.contracts.topics import Topics
from pipeline.core.controller import Decision
from pipeline.core.thresholds import Thresholds
from pipeline.settings import Settings

NOW = 1_800_000_000_000


def result(rid: str, tier: str, score: float, handover: bool) -> bytes:
    rec: dict[str, Any] = {
        "request_id": rid, "tier": tier, "stage": tier, "model": f"{tier}-m", "intent": "a", "confidence": 0.9,
        "final": True, "shadow": False, "escalated": False, "degraded": False, "replay": False,
        "threshold_version": 1, "answered_at": NOW, "batch_size": 1, "label": None,
        "timings_ms": {"ingest": 1, "queue": 2, "inference": 3, "total": 10},
        "features": {"chars": 30, "vip": False}, "oos_score": score, "abstained": handover,
    }
    if handover:
        rec.update(handover=True, handover_reason="out_of_scope")
    return orjson.dumps(rec)


def agent() -> Feedback:
    return Feedback(Settings(), client=cast(Any, object()))  # nothing here reaches Redis


def test_publishes_the_hand_over_share_and_the_thresholds_it_moves() -> None:
    fb = agent()
    results = Topics(fb.s.topic.prefix).results
    for i in range(8):
        fb.add(results, 0, i, result(f"r{i}", "heavy" if i % 2 else "light", 0.1, False), NOW)
    for i in range(8, 10):
        fb.add(results, 0, i, result(f"r{i}", "multimodal", 0.9, True), NOW)
    w, _ = fb.measure(NOW)
    assert w.handovers == 2 and w.finals == 10
    fb.thresholds = Thresholds(handover_above=0.65)
    fb.publish(w)
    assert REGISTRY.get_sample_value("tierflow_handover_share") == 0.2
    assert metrics.HANDOVER_SHARE.exported
    assert REGISTRY.get_sample_value("tierflow_threshold", {"name": "handover_above"}) == 0.65


def test_a_hand_over_move_alone_keeps_the_watched_changes_count() -> None:
    fb = agent()
    fb.agg.track_since(6)  # the change under watch, v6
    alone = Decision("change", "hand-over share over budget", {}, fb.state, {"handover_above": 0.55})
    fb.after_tick(TickResult(alone, Thresholds(version=7, handover_above=0.55)))
    assert fb.agg.since is not None and fb.agg.since.version == 6
    hold = Decision("hold", "within", {}, fb.state)
    fb.after_tick(TickResult(hold, None))
    assert fb.agg.since is None  # nothing under watch any more (the state's pending is None)

"""Folding the control topic's records into state: the latest record of a key wins, a tombstone deletes it, and a
record that is not ours is counted, never fatal."""

from __future__ import annotations

from pipeline.contracts.keys import ControlKeys
from pipeline.core.control import ControlState, fold, model_manifest, replay_progress, vip_value
from pipeline.core.thresholds import Thresholds


def doc(version: int, **values: object) -> bytes:
    return Thresholds(version=version, **values).model_dump_json().encode()  # type: ignore[arg-type]


def test_versions_come_back_in_order_and_the_latest_record_of_a_version_wins() -> None:
    state = fold([(ControlKeys.thresholds(2), doc(2, length_threshold=60)),
                  (ControlKeys.thresholds(1), doc(1)),
                  (ControlKeys.thresholds(2), doc(2, length_threshold=70))])
    assert [d.version for d in state.thresholds] == [1, 2]
    assert state.current is not None and state.current.length_threshold == 70


def test_a_tombstone_removes_a_vip_and_a_later_record_brings_it_back() -> None:
    state = fold([(ControlKeys.vip("a").encode(), vip_value()), (ControlKeys.vip("b"), vip_value()),
                  (ControlKeys.vip("a"), None), (ControlKeys.vip("b"), None), (ControlKeys.vip("b"), vip_value())])
    assert state.vips == frozenset({"b"})


def test_foreign_and_invalid_records_are_skipped() -> None:
    state = fold([(None, b"x"), ("feedback:state", b"{}"), (ControlKeys.thresholds(3), b"{not json"),
                  (ControlKeys.thresholds(4), doc(4, heavy_budget=0.1)), ("thresholds:abc", doc(5))])
    assert [d.version for d in state.thresholds] == [4] and state.skipped == 4


def test_summary_says_what_was_there() -> None:
    assert ControlState().empty and ControlState().summary() == "no thresholds, 0 VIPs"
    state = fold([(ControlKeys.thresholds(1), doc(1)), (ControlKeys.vip("u"), vip_value())])
    assert state.summary() == "thresholds v1 (1 versions), 1 VIP"


def test_replay_progress_and_answered_ids_fold_like_the_rest() -> None:
    state = fold([(ControlKeys.replay_job("job-1"), replay_progress({"position": "[0, 60]", "sent": 60})),
                  (ControlKeys.replay_answered("r-1"), b"1"), (ControlKeys.replay_answered("r-2"), b"1"),
                  (ControlKeys.replay_job("job-1"), replay_progress({"position": "[0, 120]", "sent": 120})),
                  (ControlKeys.replay_answered("r-2"), None), (ControlKeys.replay_job("job-2"), b"[1, 2]")])
    assert state.replay_jobs == {"job-1": {"position": "[0, 120]", "sent": "120"}}
    assert state.replay_answered == frozenset({"r-1"}) and state.skipped == 1
    assert state.summary() == "no thresholds, 0 VIPs, 1 replay job(s) with 1 answered ids"


def test_model_versions_pointer_and_history() -> None:
    state = fold([(ControlKeys.model_weights("v1"), b"w1"), (ControlKeys.model_version("v1"), model_manifest({}, 1)),
                  (ControlKeys.model_weights("v2"), b"w2"), (ControlKeys.model_version("v2"), model_manifest({}, 2)),
                  (ControlKeys.model_version("v2"), model_manifest({"status": "promoted"}, 2.0)),
                  (ControlKeys.model_event(30.0, "promote", "v2"), b'{"action": "promote"}'),
                  (ControlKeys.model_event(25.0, "store", "v2"), b'{"action": "store"}'),
                  (ControlKeys.MODEL_LIVE, b"v2"), (ControlKeys.model_version("v1"), None),
                  (ControlKeys.model_weights("v3"), b"w3"),  # its manifest never came: not a whole version
                  (ControlKeys.model_version("v4"), b'{"manifest": {}}')])
    assert set(state.models) == {"v2"} and state.models["v2"].weights == b"w2" and state.model_live == "v2"
    assert state.models["v2"].manifest == {"status": "promoted"}
    assert [e["action"] for e in state.model_history] == ["store", "promote"]  # in time order
    assert state.skipped == 1

"""The records of pipeline/contracts/records.py: one builder and one reader per kind, and the fast paths, checked
against the schemas and the slow path's models (whatever a builder writes, both accept; whatever a fast path
takes, both take, value for value)."""

from __future__ import annotations

import json
from typing import Any, get_args

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.adapters.heartbeats import observation
from pipeline.contracts.models import (
    RoutedRequest,
    decode_model,
    decode_request,
    validate_answer,
    validate_handover,
    validate_result,
)
from pipeline.contracts.records import (
    Features,
    RoutedBatch,
    Script,
    answer,
    answer_of,
    dump_answer_and_result,
    dump_heartbeat,
    dump_routed,
    escalation,
    fast_request,
    fast_routed,
    handover,
    handover_of,
    heartbeat,
    heartbeat_of,
    replayed,
    result_details,
    result_of,
    routed_fields,
)
from pipeline.contracts.topics import Tier
from pipeline.errors import InvalidMessage
from tests.unit.contracts.samples import CASES, CONTEXT, ROUTED, fields, fields_of, schema_ok


# --------------------------------------------------------------------------- fast paths
def _model_ok(raw: bytes) -> bool:
    try:
        decode_request(raw, 10**8)
        return True
    except InvalidMessage:
        return False


@settings(max_examples=300, deadline=None)
@given(fields)
def test_fast_request_accepts_only_what_the_schema_and_model_accept(obj: dict[str, Any]) -> None:
    raw = json.dumps(obj).encode()
    if fast_request(raw) is not None:  # the ingest fast path only ever accepts what the schema accepts
        assert schema_ok("request", obj) and _model_ok(raw)


@pytest.mark.parametrize("obj", CASES)
def test_fast_request_never_accepts_invalid(obj: Any) -> None:
    if fast_request(json.dumps(obj).encode()) is not None:
        assert schema_ok("request", obj)


routed_mutations = st.fixed_dictionaries({}, optional={
    "request": st.one_of(st.just({"id": "r"}), st.just({"id": "r", "text": "t", "x": 1}), st.just([]),
                         st.just({"id": "r", "text": "t", "ts": True})),
    "features": st.one_of(st.just({}), st.just({**ROUTED["features"], "chars": "22"}),
                          st.just({**ROUTED["features"], "script": "fr"}),
                          st.just({**ROUTED["features"], "vip": 0})),
    "tier": st.sampled_from(["light", "heavy", "gpu", 1]),
    "route_reason": st.one_of(st.text(max_size=2), st.integers()),
    "degraded": st.one_of(st.booleans(), st.integers(0, 1), st.none()),
    "threshold_version": st.one_of(st.integers(-1, 2), st.floats(0, 2), st.booleans()),
    "escalate_below": st.one_of(st.floats(-1, 2, allow_nan=False), st.integers(0, 1), st.text(max_size=1)),
    "received_ms": st.one_of(st.integers(-1, 2), st.text(max_size=1)),
    "replay": st.one_of(st.booleans(), st.integers(0, 1)),
    "replay_job": st.one_of(st.text(max_size=2), st.integers()),
    "escalated_from": st.just({"tier": "light", "intent": "x", "confidence": 0.1, "model": "m",
                               "inference_ms": 1.0}),
    "extra": st.integers(),
}, )


@settings(max_examples=300, deadline=None)
@given(routed_mutations, st.sets(st.sampled_from(sorted(ROUTED)), max_size=2))
def test_fast_routed_accepts_only_what_the_model_accepts(changes: dict[str, Any], dropped: set[str]) -> None:
    obj = {k: v for k, v in {**ROUTED, **changes}.items() if k not in dropped}
    raw = json.dumps(obj).encode()
    fast = fast_routed(raw)
    if fast is not None:  # the workers' fast path: the model agrees, value for value
        model = RoutedRequest.model_validate_json(raw).model_dump(mode="json", exclude_none=True)
        assert {**{k: v for k, v in model.items() if k not in fast}, **fast} == model
        assert schema_ok("routed", obj)


def test_fast_routed_takes_what_ingest_writes() -> None:
    assert fast_routed(json.dumps(ROUTED).encode()) == ROUTED
    assert fast_routed(b"{") is None


# --------------------------------------------------------------------------- the routed record's builders
FEATURES: Features = ROUTED["features"]
RAW = orjson.dumps(ROUTED["request"])


def _check_routed(raw: bytes) -> dict[str, Any]:
    """A routed record both the schema and RoutedRequest accept, as the worker's slow path reads it."""
    doc = orjson.loads(raw)
    assert schema_ok("routed", doc), doc
    dumped: dict[str, Any] = decode_model(RoutedRequest, raw).model_dump(mode="json", exclude_none=True)
    assert {**dumped, **doc} == dumped and set(dumped) - set(doc) <= {"replay_force"}  # the model's default
    return doc


def test_ingests_two_writers_write_the_same_record() -> None:
    """The hot loop's pre-serialised batch and the slow path's dict builder: every field and value the same."""
    batch = RoutedBatch(7, 0.55, 2)
    fast = batch.dump(RAW, orjson.dumps(FEATURES), 1, RoutedBatch.route(Tier.HEAVY, "long", True))
    slow = dump_routed(RAW, routed_fields(FEATURES, Tier.HEAVY, "long", True, 7, 0.55, 1, 2))
    assert _check_routed(fast) == _check_routed(slow)
    assert fast_routed(fast) == fast_routed(slow) == orjson.loads(slow)


@settings(max_examples=300, deadline=None)
@given(chars=st.integers(0, 10**7), tokens=st.integers(0, 10**6), script=st.sampled_from(get_args(Script)),
       lang=st.one_of(st.sampled_from(["en", "zh", "other"]), st.text(max_size=16)), flags=st.lists(st.booleans(),
       min_size=5, max_size=5), image_bytes=st.integers(0, 10**7))
def test_the_features_writer_is_orjson_whatever_the_values(chars: int, tokens: int, script: Script, lang: str,
                                                           flags: list[bool], image_bytes: int) -> None:
    """A producer's `lang` hint can hold quotes, backslashes or any character: still the same bytes as orjson."""
    has_image, vip, question, complaint, urgent = flags
    f: Features = {"chars": chars, "tokens": tokens, "script": script, "lang": lang, "has_image": has_image,
                   "image_bytes": image_bytes, "vip": vip, "question": question, "complaint": complaint,
                   "urgent": urgent, "length": chars * 3}
    assert list(f) == list(Features.__annotations__)
    assert RoutedBatch.features(f) == orjson.dumps(f)


def test_a_replayed_record_is_marked_and_still_takes_the_fast_path() -> None:
    fields = replayed(routed_fields(FEATURES, Tier.LIGHT, "short", False, 1, 0.5, 1, 2), "job-1", True)
    doc = _check_routed(dump_routed(RAW, fields))
    assert (doc["replay"], doc["replay_job"], doc["replay_force"]) == (True, "job-1", True)
    assert fast_routed(dump_routed(RAW, fields)) == doc


def test_an_escalation_carries_the_light_verdict_to_heavy() -> None:
    d = fast_routed(orjson.dumps(ROUTED))
    assert d is not None
    up = escalation(d, Tier.LIGHT, "lost_card", 0.25, "light-m", 1.23456)
    doc = _check_routed(orjson.dumps(up))
    assert doc == {**ROUTED, "tier": "heavy", "route_reason": "short:escalated",
                   "escalated_from": {"tier": "light", "intent": "lost_card", "confidence": 0.25, "model": "light-m",
                                      "inference_ms": 1.235, "oos_score": 0.0, "abstained": False}}
    assert d == ROUTED  # not changed: its own result was already written from it
    assert fast_routed(orjson.dumps(up)) is None  # escalations take the full model


def test_an_abstention_says_so_in_the_escalation_and_its_route() -> None:
    d = fast_routed(orjson.dumps(ROUTED))
    assert d is not None
    up = escalation(d, Tier.LIGHT, "lost_card", 0.9, "light-m", 1.0, oos_score=0.81234, abstained=True)
    doc = _check_routed(orjson.dumps(up))
    assert doc["route_reason"] == "short:abstained"
    assert (doc["escalated_from"]["oos_score"], doc["escalated_from"]["abstained"]) == (0.8123, True)


@pytest.mark.parametrize("value", [1, "0.5", 1.5, -0.1, True])
def test_scope_thresholds_that_are_not_scores_leave_the_fast_path(value: object) -> None:
    """The schema says a number in [0, 1]: anything else the slow path judges (and the schema may refuse)."""
    assert fast_routed(orjson.dumps({**ROUTED, "handover_above": value})) is None
    assert fast_routed(orjson.dumps({**ROUTED, "abstain_above": value})) is None
    assert fast_routed(orjson.dumps({**ROUTED, "abstain_above": 0.7, "handover_above": 0.9})) is not None


# --------------------------------------------------------------------------- the answer and the result
def test_the_answer_and_result_builders_write_what_the_schemas_and_records_accept() -> None:
    d = fast_routed(orjson.dumps({**ROUTED, "request": {**ROUTED["request"], "label": "reset_pin"}}))
    assert d is not None
    d["context"] = CONTEXT  # a conversation's record (those take the full model in a worker)
    a = answer(d, Tier.LIGHT, "Here is how.", "reset_pin", 1.2, "light-m", 0.4567, 10, 20, fallback="timeout",
               handover="out_of_scope", write_ms=0.2)
    a["context_used"] = ["previous_turn"]
    answer_json, result_json = dump_answer_and_result(
        a, result_details(d, Tier.LIGHT, True, 10, 15, 20, 3, "w-1", oos_score=0.91, abstained=True))
    ans, res = orjson.loads(answer_json), orjson.loads(result_json)
    # every field of the schemas written (a field added to schema and record but not the builder fails here)
    assert set(ans) == fields_of("answer")[0] and set(res) == fields_of("result")[0]
    expected = {
        "request_id": "r1", "user_id": "u1", "answer": "Here is how.", "intent": "reset_pin", "confidence": 1.0,
        "tier": "light", "model": "light-m", "escalated": False, "degraded": False, "route_reason": "short",
        "timings_ms": {"ingest": 1, "queue": 8, "inference": 0.457, "total": 19, "write": 0.2}, "replay": False,
        "threshold_version": 1, "lang": "en", "answered_at": 20, "fallback": True, "fallback_reason": "timeout",
        "handover": True, "handover_reason": "out_of_scope", "conversation_id": "u1:r0", "turn": 2,
        "context_used": ["previous_turn"],
    }
    assert {k: ans[k] for k in expected} == expected
    assert res == {**ans, "final": True, "stage": "light", "shadow": False, "features": FEATURES,
                   "timestamps": {"received": 1, "ingested": 2, "dequeued": 10, "inferred": 15, "produced": 20},
                   "batch_size": 3, "worker_id": "w-1", "label": "reset_pin", "light_intent": None,
                   "light_confidence": None, "oos_score": 0.91, "abstained": True}
    assert schema_ok("answer", ans) and schema_ok("result", res)
    assert validate_answer(ans) == ans and validate_result(res) == res
    assert answer_of(answer_json) == ans and result_of(result_json) == res


def test_the_handover_builder_writes_what_the_schema_and_record_accept() -> None:
    d = fast_routed(orjson.dumps({**ROUTED, "handover_above": 0.6}))
    assert d is not None
    d["context"] = CONTEXT
    up = escalation(d, Tier.LIGHT, "lost_card", 0.3, "light-m", 1.0, oos_score=0.7, abstained=True)
    a = answer(up, Tier.HEAVY, "A colleague will reply.", "lost_card", 0.4, "heavy-m", 3.0, 10, 20,
               handover="out_of_scope")
    h = handover(up, a, 0.87654)
    raw = orjson.dumps(h)
    assert set(h) == fields_of("handover")[0] and schema_ok("handover", h) and validate_handover(h) == h
    assert handover_of(raw) == h
    assert (h["request_id"], h["text"], h["reason"], h["oos_score"], h["handover_above"], h["tier"]) == \
        ("r1", "How do I reset my PIN?", "out_of_scope", 0.8765, 0.6, "heavy")
    assert (h["light_intent"], h["light_confidence"], h["holding_message"]) == \
        ("lost_card", 0.3, "A colleague will reply.")
    assert h["conversation"] == CONTEXT["history"] and h["slots"] == CONTEXT["slots"]  # the desk sees the talk
    assert not schema_ok("handover", {**h, "oos_score": 1.5}) and not schema_ok("handover", {**h, "x": 1})


def test_an_answer_without_a_writer_s_fallback_carries_no_fallback_mark() -> None:
    d = fast_routed(orjson.dumps(ROUTED))
    assert d is not None
    a = answer(d, Tier.LIGHT, "Here is how.", "reset_pin", 0.9, "light-m", 0.4, 10, 20)
    assert "fallback" not in a and "fallback_reason" not in a and schema_ok("answer", dict(a))


def test_the_heavy_answer_to_an_escalation_names_the_light_stage() -> None:
    d = fast_routed(orjson.dumps({**ROUTED, "received_ms": 50}))  # ingested before received: two hosts' clocks
    assert d is not None
    up = escalation(d, Tier.LIGHT, "other", 0.2, "light-m", 2.0)
    a = answer(up, Tier.HEAVY, "ok", "reset_pin", -0.1, "heavy-m", 30.0, 40, 45)
    _, result_json = dump_answer_and_result(a, result_details(up, Tier.HEAVY, True, 40, 44, 45, 1, "w-2"))
    res = orjson.loads(result_json)
    assert schema_ok("result", res)
    assert (res["escalated"], res["confidence"], res["timings_ms"]) == (
        True, 0.0, {"ingest": 0, "queue": 38, "inference": 32.0, "total": 0})
    assert (res["light_intent"], res["light_confidence"], res["route_reason"]) == ("other", 0.2, "short:escalated")


def test_the_readers_refuse_what_is_not_a_record() -> None:
    for junk in (None, b"", b"not json", b"[1]", b'"x"'):
        assert answer_of(junk) is None and result_of(junk) is None


# --------------------------------------------------------------------------- the heartbeat
def test_the_builder_fills_every_field_and_refuses_unknown_ones() -> None:
    hb = heartbeat(worker="w1", tier="heavy", lag=3, live_p95_ms=12.5, ready=True)
    assert hb["busy_ms"] == 0.0 and hb["model"] == "?" and hb["lag"] == 3 and hb["ready"] is True
    with pytest.raises(TypeError, match="unknown fields \\['lagg'\\]"):
        heartbeat(lagg=3)


def test_the_reader_takes_what_older_writers_wrote_and_refuses_what_is_not_a_heartbeat() -> None:
    old = orjson.dumps({"ts": 1.5, "worker": "w0", "lag": "7", "p95_ms": 40})  # before busy_ms and live_p95_ms
    hb = heartbeat_of(old)
    assert hb is not None
    assert (hb["lag"], hb["p95_ms"], hb["busy_ms"], hb["live_p95_ms"], hb["ready"]) == (7, 40.0, 0.0, 0.0, False)
    assert heartbeat_of(dump_heartbeat(heartbeat(busy_ms=900.0))) == heartbeat(busy_ms=900.0)
    for junk in (b"", b"not json", b"[1, 2]", b'{"lag": "many"}'):
        assert heartbeat_of(junk) is None


def test_the_tier_observation_takes_the_worst_live_p95_or_batch_in_hand() -> None:
    beats = [heartbeat(lag=5, live_p95_ms=100.0, p95_ms=9000.0, ready=True),
             heartbeat(lag=2, live_p95_ms=80.0, busy_ms=650.0, ready=True)]
    obs = observation(beats)
    # a replay's slow answers (p95_ms) are not the live SLO's; the second worker's batch in hand is
    assert (obs.workers, obs.lag, obs.p95_ms) == (2, 7, 650.0)
    assert observation([]).workers == 0


def test_workers_that_are_not_ready_count_as_starting_not_as_workers() -> None:
    beats = [heartbeat(ready=False, up_s=40.0, lag=99), heartbeat(ready=False, up_s=3.5),
             heartbeat(ready=True, lag=1, live_p95_ms=20.0)]
    obs = observation(beats)
    # the youngest start is what a reader waits for; a starting worker's lag and latency are not the tier's
    assert (obs.workers, obs.lag, obs.p95_ms, obs.starting_s) == (1, 1, 20.0, 3.5)
    assert observation(beats[2:]).starting_s is None

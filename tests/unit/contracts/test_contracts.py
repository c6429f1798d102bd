"""The Python models agree with the JSON Schemas in schemas/ on what is valid."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

import schemas
from pipeline.contracts import models, records
from pipeline.contracts.models import (
    Label,
    Request,
    RoutedRequest,
    decode_model,
    decode_request,
    validate_answer,
    validate_result,
)
from pipeline.contracts.records import fast_routed
from pipeline.errors import InvalidMessage
from tests.unit.contracts.samples import CASES, ROUTED, fields, fields_of, schema_ok


def model_ok(raw: bytes) -> bool:
    try:
        decode_request(raw, 10**8)
        return True
    except InvalidMessage:
        return False


@pytest.mark.parametrize("kind", schemas.KINDS)
def test_schemas_are_valid_json_schema(kind: str) -> None:
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schemas.load(kind))


@pytest.mark.parametrize(("model", "kind"), [(Request, "request"), (RoutedRequest, "routed"), (Label, "label")])
def test_model_fields_match_schema_properties(model: Any, kind: str) -> None:
    assert set(model.model_fields) == fields_of(kind)[0]


def test_the_result_schema_extends_the_answer_schema() -> None:
    """The answer's fields are spelled once (answer.v1.json `$defs/fields`); the result adds the stage's."""
    answer_props, answer_required = fields_of("answer")
    result_props, result_required = fields_of("result")
    assert answer_props < result_props and answer_required < result_required
    assert "properties" not in schemas.load("answer")  # only in $defs: no second spelling to drift
    assert not set(schemas.load("result")["properties"]) & answer_props


ANSWER: dict[str, Any] = {
    "request_id": "r1", "user_id": None, "answer": "ok", "intent": "card_arrival", "confidence": 0.9,
    "tier": "light", "model": "m", "escalated": False, "degraded": False, "route_reason": "short",
    "timings_ms": {"ingest": 0, "queue": 1, "inference": 0.5, "total": 3}, "replay": False,
    "threshold_version": 1, "lang": "en", "answered_at": 5,
}
DETAILS: dict[str, Any] = {
    "final": True, "stage": "light", "shadow": False, "features": ROUTED["features"],
    "timestamps": {"received": 1, "ingested": 2, "dequeued": 3, "inferred": 4, "produced": 5},
    "batch_size": 1, "worker_id": "w", "label": None, "light_intent": None, "light_confidence": None,
}
ANSWER_CASES: list[dict[str, Any]] = [
    {}, {"lang": None}, {"confidence": 1.5}, {"tier": "gpu"}, {"extra": 1}, {"request_id": ""},
    {"timings_ms": {"ingest": 0, "queue": 1, "inference": 0.5}}, {"timings_ms": {**ANSWER["timings_ms"], "x": 1}},
    {"timings_ms": {**ANSWER["timings_ms"], "queue": -1}}, {"threshold_version": -1}, {"answered_at": -1},
    {"user_id": 3},
]  # (lax types such as "no" for false the TypeAdapters take, as the pydantic models did: workers write these)
RESULT_CASES: list[dict[str, Any]] = [
    *ANSWER_CASES, {"batch_size": 0}, {"stage": "gpu"}, {"features": {**ROUTED["features"], "vip": "maybe"}},
    {"features": {**ROUTED["features"], "x": 1}}, {"timestamps": {"received": 1}}, {"light_confidence": "x"},
]


def _valid(validate: Any, obj: Any) -> bool:
    try:
        validate(obj)
        return True
    except ValidationError:
        return False


@pytest.mark.parametrize("changes", ANSWER_CASES)
def test_the_answer_record_and_schema_agree(changes: dict[str, Any]) -> None:
    obj = {**ANSWER, **changes}
    assert _valid(validate_answer, obj) == schema_ok("answer", obj)
    assert not schema_ok("answer", {**obj, **DETAILS})  # an answer is closed: a result is not an answer


@pytest.mark.parametrize("changes", RESULT_CASES)
def test_the_result_record_and_schema_agree(changes: dict[str, Any]) -> None:
    obj = {**ANSWER, **DETAILS, **changes}
    assert _valid(validate_result, obj) == schema_ok("result", obj)


@pytest.mark.parametrize(("record", "kind"), [(records.Answer, "answer"), (records.Result, "result"),
                                              (records.Routed, "routed"), (records.RequestRecord, "request"),
                                              (records.AnswerDraft, "answer_draft")])
def test_record_keys_are_the_schema_properties(record: Any, kind: str) -> None:
    """A field added to the record but not the schema, or the other way round, fails here."""
    props, required = fields_of(kind)
    assert set(record.__annotations__) == props
    assert record.__required_keys__ == required


def test_the_routed_record_has_routed_requests_fields() -> None:
    for record, model in ((records.Routed, RoutedRequest), (records.Features, models.Features),
                          (records.EscalatedFrom, models.EscalatedFrom), (records.RequestRecord, Request),
                          (records.Image, models.Image)):
        assert set(record.__annotations__) == set(model.model_fields), record
    assert fields_of("routed")[0] == set(records.RoutedFields.__annotations__) | {"request"}


@pytest.mark.parametrize("obj", CASES)
def test_model_and_schema_agree(obj: Any) -> None:
    assert model_ok(json.dumps(obj).encode()) == schema_ok("request", obj)


@settings(max_examples=300, deadline=None)
@given(fields)
def test_model_and_schema_agree_on_generated_requests(obj: dict[str, Any]) -> None:
    raw = json.dumps(obj).encode()
    assert model_ok(raw) == schema_ok("request", obj)


def test_errors_are_classified() -> None:
    with pytest.raises(InvalidMessage) as e:
        decode_request(b"{", 100)
    assert e.value.kind == "not_json"
    with pytest.raises(InvalidMessage) as e:
        decode_request(b"\xff\xfe", 100)
    assert e.value.kind == "encoding"
    with pytest.raises(InvalidMessage) as e:
        decode_request(b'{"id": "1", "text": "' + b"x" * 200 + b'"}', 100)
    assert e.value.kind == "oversize"
    with pytest.raises(InvalidMessage) as e:
        decode_request(None, 100)
    assert e.value.kind == "schema"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


ESCALATED = {"tier": "light", "intent": "x", "confidence": 0.3, "model": "m", "inference_ms": 1.5}


def _routed_raw(**changes: Any) -> bytes:
    doc: dict[str, Any] = {**ROUTED}
    for path, value in changes.items():
        head, _, rest = path.partition("__")
        doc[head] = {**(doc.get(head) or ESCALATED), rest: value} if rest else value
    return json.dumps(doc).encode()  # the stdlib writes NaN / Infinity for floats that are not finite


@pytest.mark.parametrize("changes", [
    {"received_ms": 2**63}, {"ingested_ms": 2**64 - 1}, {"threshold_version": 2**70}, {"features__chars": 2**63},
    {"features__tokens": 2**64}, {"features__image_bytes": 2**80},
    {"escalated_from__inference_ms": float("nan")}, {"escalated_from__inference_ms": float("inf")},
    {"escalated_from__confidence": float("-inf")}, {"escalate_below": float("nan")},
    {"degraded": "no"}, {"degraded": 0}, {"replay": 1}, {"escalate_below": "0.5"}, {"features__chars": "2"},
    {"features__vip": 0}, {"escalated_from__extra": 1},
])
def test_routed_records_the_schema_rejects_the_worker_rejects(changes: dict[str, Any]) -> None:
    """Regression (found by the fault suite's routed poison): pipeline/contracts/models.py, a routed record written
    straight to a tier topic with a number beyond 64 bits made the worker's answer unwritable (dead-lettered as
    'internal', a TypeError), NaN / Infinity in escalated_from was answered with `"inference": null` (not
    answer.v1), and lax types ("no" for false, "0.5" for 0.5) were answered though the schema rejects them."""
    raw = _routed_raw(**changes)
    if b"NaN" in raw or b"Infinity" in raw:  # not JSON at all: no schema to ask
        with pytest.raises(ValueError):
            json.loads(raw, parse_constant=_not_json)
    else:
        assert not schema_ok("routed", json.loads(raw))
    assert fast_routed(raw) is None
    with pytest.raises(InvalidMessage) as e:
        decode_model(RoutedRequest, raw)
    assert e.value.kind == "schema"


@pytest.mark.parametrize("text", [b"1e400", b"-1e400", b"1" + b"0" * 400 + b".0"])
def test_numbers_beyond_a_double_in_a_routed_record_are_refused(text: bytes) -> None:
    raw = _routed_raw(escalated_from__inference_ms="@").replace(b'"@"', text)
    with pytest.raises(InvalidMessage):
        decode_model(RoutedRequest, raw)
    assert not schema_ok("routed", json.loads(raw))  # read as infinity: over the schema's maximum


def test_the_largest_numbers_a_routed_record_may_carry_are_taken() -> None:
    raw = _routed_raw(received_ms=2**63 - 1, ingested_ms=2**63 - 1, features__chars=2**63 - 1,
                      escalated_from__inference_ms=1e308)
    assert schema_ok("routed", json.loads(raw))
    rr = decode_model(RoutedRequest, raw)
    assert rr.received_ms == 2**63 - 1 and rr.escalated_from is not None
    assert fast_routed(_routed_raw(received_ms=2**63 - 1)) is not None

"""The Python models agree with the JSON Schemas in schemas/ on what is valid."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schemas
from pipeline.contracts.models import (
    Answer,
    Label,
    Request,
    Result,
    RoutedRequest,
    decode_model,
    decode_request,
    fast_request,
    fast_routed,
)
from pipeline.errors import InvalidMessage

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nxxxx").decode()


def schema_ok(kind: str, obj: Any) -> bool:
    return not list(schemas.validator(kind).iter_errors(obj))


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


@pytest.mark.parametrize(("model", "kind"), [(Request, "request"), (Answer, "answer"), (Result, "result"),
                                             (RoutedRequest, "routed"), (Label, "label")])
def test_model_fields_match_schema_properties(model: Any, kind: str) -> None:
    assert set(model.model_fields) == set(schemas.load(kind)["properties"])


CASES: list[Any] = [
    {"id": "1", "text": "hi"},
    {"id": "1", "image": {"data": PNG, "mime": "image/png"}},
    {"id": "1", "text": "", "image": {"data": PNG, "mime": "image/jpeg"}},
    {"id": "1", "text": "hi", "user_id": "u", "lang": "zh", "ts": 1, "label": "card_arrival", "meta": {"a": [1]}},
    {"id": "1", "text": ""},
    {"id": "1"},
    {"id": "", "text": "x"},
    {"id": "x" * 129, "text": "x"},
    {"id": "1", "text": "x" * 32_769},
    {"id": "1", "text": "x", "extra": 1},
    {"id": "1", "text": "x", "ts": -1},
    {"id": "1", "text": "x", "image": {"data": PNG, "mime": "image/gif"}},
    {"id": "1", "text": "x", "image": {"data": PNG}},
    {"id": 1, "text": "x"},
    {"id": "1", "text": None},
    [],
    "text",
]


@pytest.mark.parametrize("obj", CASES)
def test_model_and_schema_agree(obj: Any) -> None:
    assert model_ok(json.dumps(obj).encode()) == schema_ok("request", obj)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)
fields = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.text(max_size=3), st.integers(), st.none()),
    "text": st.one_of(st.text(max_size=3), st.integers(), st.none()),
    "user_id": st.one_of(st.text(max_size=2), st.integers()),
    "lang": st.text(max_size=2),
    "ts": st.integers(-2, 2),
    "label": st.text(max_size=2),
    "meta": st.dictionaries(st.text(max_size=2), json_values, max_size=2),
    "image": st.fixed_dictionaries({"data": st.just(PNG)}, optional={"mime": st.sampled_from(
        ["image/png", "image/gif", "image/webp"])}),
})


@settings(max_examples=300, deadline=None)
@given(fields)
def test_model_and_schema_agree_on_generated_requests(obj: dict[str, Any]) -> None:
    raw = json.dumps(obj).encode()
    assert model_ok(raw) == schema_ok("request", obj)
    if fast_request(raw) is not None:  # the ingest fast path only ever accepts what the schema accepts
        assert schema_ok("request", obj)


@pytest.mark.parametrize("obj", CASES)
def test_fast_path_never_accepts_invalid(obj: Any) -> None:
    if fast_request(json.dumps(obj).encode()) is not None:
        assert schema_ok("request", obj)


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


ROUTED: dict[str, Any] = {
    "request": {"id": "r1", "text": "How do I reset my PIN?", "user_id": "u1", "ts": 5},
    "features": {"chars": 22, "tokens": 7, "script": "en", "lang": "en", "has_image": False, "image_bytes": 0,
                 "vip": False, "question": True, "complaint": False, "urgent": False},
    "tier": "light", "route_reason": "short", "degraded": False, "threshold_version": 1, "escalate_below": 0.5,
    "received_ms": 1, "ingested_ms": 2, "replay": False, "shadow": False,
}
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

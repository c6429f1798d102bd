"""The Python models agree with the JSON Schemas in schemas/ on what is valid."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schemas
from pipeline.contracts import Answer, Label, Request, Result, RoutedRequest, decode_request, fast_request
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

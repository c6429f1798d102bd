"""What the contract tests share: requests (valid and not, and a strategy), a routed record as ingest writes it,
and schema helpers."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

import schemas

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nxxxx").decode()

ROUTED: dict[str, Any] = {
    "request": {"id": "r1", "text": "How do I reset my PIN?", "user_id": "u1", "ts": 5},
    "features": {"chars": 22, "tokens": 7, "script": "en", "lang": "en", "has_image": False, "image_bytes": 0,
                 "vip": False, "question": True, "complaint": False, "urgent": False, "length": 22},
    "tier": "light", "route_reason": "short", "degraded": False, "threshold_version": 1, "escalate_below": 0.5,
    "received_ms": 1, "ingested_ms": 2, "replay": False, "shadow": False,
}


def schema_ok(kind: str, obj: Any) -> bool:
    return not list(schemas.validator(kind).iter_errors(obj))


def _resolve(kind: str, ref: str) -> dict[str, Any]:
    doc, _, pointer = ref.partition("#")
    target = schemas.load(next(k for k in schemas.KINDS if schemas.load(k)["$id"] == doc)) if doc else \
        schemas.load(kind)
    for part in filter(None, pointer.split("/")):
        target = target[part]
    return target


def fields_of(kind: str) -> tuple[set[str], set[str]]:
    """(properties, required) of a schema's object, through the `$ref`s it extends."""
    props: set[str] = set()
    required: set[str] = set()
    todo = [schemas.load(kind)]
    while todo:
        s = todo.pop()
        props |= set(s.get("properties", {}))
        required |= set(s.get("required", []))
        if "$ref" in s:
            todo.append(_resolve(kind, s["$ref"]))
    return props, required


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

# A routed record's conversation: the second turn, after a warranty question
CONTEXT: dict[str, Any] = {
    "conversation_id": "u1:r0", "turn": 2,
    "history": [{"text": "my headphones stopped working", "lang": "en", "intent": "warranty_repair",
                 "answer": "Electronics have a 1-year warranty."}],
    "slots": {"order_id": "58213", "product": "headphones"}, "follow_up": True, "unresolved_marker": False,
    "topic": "warranty_repair", "topic_turns": 1, "unresolved": 0, "complaints": 0,
}

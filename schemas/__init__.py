"""Versioned JSON Schema contracts of every topic's messages (`<kind>.v<N>.json`)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

KINDS = ("request", "routed", "result", "answer", "answer_draft", "dlq", "label", "handover")


@cache
def load(kind: str, version: int = 1) -> dict[str, Any]:
    """The JSON Schema of one message kind, as a dict."""
    text = resources.files(__name__).joinpath(f"{kind}.v{version}.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def validator(kind: str, version: int = 1) -> Any:
    """A jsonschema validator for `kind` that resolves references between tierflow's schemas."""
    import jsonschema
    from referencing import Registry, Resource

    registry: Registry = Registry().with_resources(
        (load(k)["$id"], Resource.from_contents(load(k))) for k in KINDS
    )
    return jsonschema.Draft202012Validator(load(kind, version), registry=registry)

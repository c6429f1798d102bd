"""The slow path's validation of the message contracts in `schemas/` (checked against them by
tests/unit/contracts/): pydantic models of requests, routed records and labels, and TypeAdapters of the
answer and result records (`pipeline/contracts/records.py` spells those once, as TypedDicts).

Decoding is where bad input is caught: every failure is an `InvalidMessage` with a machine-readable
`kind`, so the caller can dead-letter the original bytes with a reason.
"""

from __future__ import annotations

import base64
import binascii
import math
from functools import cache
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo, model_validator

from pipeline.contracts.records import (
    MAX_IMAGE_B64,
    MAX_META_DEPTH,
    MAX_META_NUMBER,
    MAX_TEXT_CHARS,
    MAX_TS,
    Answer,
    Context,
    Count,
    Handover,
    ImageMime,
    Result,
    Script,
)
from pipeline.contracts.topics import Tier
from pipeline.errors import InvalidMessage

# NaN and Infinity are not JSON (pydantic's parser reads them, and 1e400 as infinity): no model takes them.
_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
# Routed records are written by ingest alone: as strictly typed as schemas/routed.v1.json (no "no" for false, no
# "0.5" for 0.5), so a record the schema rejects is dead-lettered, not answered.
_ROUTED = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
M = TypeVar("M", bound=BaseModel)
_WIRE = {"wire": True}


class Image(BaseModel):
    """An inline image: base64 data and its MIME type."""

    model_config = _STRICT
    data: Annotated[str, Field(max_length=MAX_IMAGE_B64)]
    mime: ImageMime

    def decode(self) -> bytes:
        """The image bytes; raises InvalidMessage(kind='bad_image') when the base64 is broken."""
        try:
            return base64.b64decode(self.data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise InvalidMessage("bad_image", f"image.data is not valid base64: {e}") from e


class Request(BaseModel):
    """A customer message (schemas/request.v1.json)."""

    model_config = _STRICT
    id: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    user_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    image: Image | None = None
    lang: Annotated[str, Field(min_length=1, max_length=16)] | None = None
    # strict: the schema says integer, so "123" and true are producer bugs, not timestamps
    ts: Annotated[int, Field(ge=0, le=MAX_TS, strict=True)] | None = None
    label: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    meta: dict[str, Any] | None = None
    conversation_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any, info: ValidationInfo) -> Any:
        # On the wire, optional means "may be absent", as in the schema: an explicit null is a producer bug.
        if isinstance(data, dict) and info.context and info.context.get("wire"):
            nulls = [k for k, v in data.items() if v is None]
            if nulls:
                raise ValueError(f"{', '.join(map(str, nulls))}: null is not allowed (omit the field)")
        return data

    @model_validator(mode="after")
    def _text_or_image(self) -> Request:
        if not self.text and self.image is None:
            raise ValueError("a request needs non-empty 'text' or an 'image'")
        if self.meta is not None:
            if _depth(self.meta) > MAX_META_DEPTH:
                raise ValueError(f"'meta' is nested deeper than {MAX_META_DEPTH} levels")
            where = _out_of_range(self.meta, "meta")
            if where:
                raise ValueError(f"{where}: a number beyond ±{MAX_META_NUMBER} (64 bits) or not finite")
        return self


def _out_of_range(value: Any, path: str) -> str | None:
    """The path of the first number in `value` no 64-bit JSON reader keeps exactly, or None."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, int):
        return path if abs(value) > MAX_META_NUMBER else None
    if isinstance(value, float):
        return path if not math.isfinite(value) or abs(value) > MAX_META_NUMBER else None
    if isinstance(value, dict):
        return next((w for k, v in value.items() if (w := _out_of_range(v, f"{path}.{k}"))), None)
    if isinstance(value, list):
        return next((w for i, v in enumerate(value) if (w := _out_of_range(v, f"{path}[{i}]"))), None)
    return None


def _depth(value: Any, level: int = 1) -> int:
    if level > MAX_META_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level - 1


class Features(BaseModel):
    """What the router knows of a request (pipeline/core/features.py computes it)."""

    model_config = _ROUTED
    chars: Count
    tokens: Count
    script: Script
    lang: str
    has_image: bool
    image_bytes: Count
    vip: bool
    question: bool
    complaint: bool
    urgent: bool
    length: Count | None = None  # English-equivalent characters (records.Features); None in older records


class EscalatedFrom(BaseModel):
    """The light tier's verdict carried along when it escalates a request."""

    model_config = _ROUTED
    tier: Tier
    intent: str
    confidence: float
    model: str
    inference_ms: float
    oos_score: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    abstained: bool | None = None


class RoutedRequest(BaseModel):
    """A validated request with its features and route (schemas/routed.v1.json), on a tier topic."""

    model_config = _ROUTED
    request: Request
    features: Features
    tier: Tier
    route_reason: str
    degraded: bool
    threshold_version: Count
    escalate_below: Annotated[float, Field(ge=0.0, le=1.0)]
    received_ms: Count
    ingested_ms: Count
    replay: bool = False
    shadow: bool = False
    escalated_from: EscalatedFrom | None = None
    replay_job: str | None = None
    replay_force: bool = False
    abstain_above: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    handover_above: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    context: Context | None = None
    handover: Annotated[str, Field(min_length=1, max_length=64)] | None = None


@cache
def _adapter(kind: type[Any]) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def validate_answer(obj: Any) -> Answer:
    """An answer (schemas/answer.v1.json) validated against `records.Answer`; raises pydantic's ValidationError."""
    a: Answer = _adapter(Answer).validate_python(obj)
    return a


def validate_handover(obj: Any) -> Handover:
    """A hand-over (schemas/handover.v1.json) validated against `records.Handover`; raises ValidationError."""
    h: Handover = _adapter(Handover).validate_python(obj)
    return h


def validate_result(obj: Any) -> Result:
    """A result (schemas/result.v1.json) validated against `records.Result`; raises pydantic's ValidationError."""
    r: Result = _adapter(Result).validate_python(obj)
    return r


class Label(BaseModel):
    """Ground truth for a request (schemas/label.v1.json)."""

    model_config = _STRICT
    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    intent: Annotated[str, Field(min_length=1)] | None = None
    rating: Annotated[int, Field(ge=1, le=5)] | None = None
    ts: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _something(self) -> Label:
        if self.intent is None and self.rating is None:
            raise ValueError("a label needs 'intent' or 'rating'")
        return self


def decode_request(raw: bytes | None, max_bytes: int) -> Request:
    """Parse and validate one request; raises InvalidMessage with the reason."""
    if raw is None:
        raise InvalidMessage("schema", "empty record (null value)")
    if len(raw) > max_bytes:
        raise InvalidMessage("oversize", f"record is {len(raw)} bytes, limit {max_bytes}")
    try:
        return Request.model_validate_json(raw, context=_WIRE)
    except ValidationError as e:
        raise InvalidMessage(*_classify(raw, e)) from None


def decode_model(model: type[M], raw: bytes | None) -> M:
    """Parse any contract model; raises InvalidMessage."""
    if raw is None:
        raise InvalidMessage("schema", "empty record (null value)")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise InvalidMessage(*_classify(raw, e)) from None


def _classify(raw: bytes, e: ValidationError) -> tuple[str, str]:
    first = e.errors(include_url=False)[0]
    etype = first["type"]
    if etype == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as ue:
            return "encoding", f"not UTF-8: {ue.reason} at byte {ue.start}"
        return "not_json", f"not JSON: {first['msg']}"
    if etype == "model_type" or etype == "model_attributes_type":
        return "schema", "a request must be a JSON object"
    loc = ".".join(str(p) for p in first["loc"]) or "(root)"
    if etype == "string_too_long" and loc in ("text", "image.data"):
        return "oversize", f"{loc}: {first['msg']}"
    return "schema", f"{loc}: {first['msg']}" + (f" ({e.error_count()} errors)" if e.error_count() > 1 else "")


def dumps(obj: Any) -> bytes:
    """JSON bytes for a model or a plain dict (orjson: the hot paths' serializer)."""
    if isinstance(obj, BaseModel):
        return orjson.dumps(obj.model_dump(mode="json"))
    return orjson.dumps(obj)

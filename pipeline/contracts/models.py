"""Python models of the message contracts in `schemas/` (checked against them by
tests/unit/contracts/test_contracts.py).

Decoding is where bad input is caught: every failure is an `InvalidMessage` with a machine-readable
`kind`, so the caller can dead-letter the original bytes with a reason.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Annotated, Any, Literal, TypeVar, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from pipeline.contracts.topics import Tier
from pipeline.errors import InvalidMessage

MAX_TEXT_CHARS = 32_768
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGE_B64 = (MAX_IMAGE_BYTES + 2) // 3 * 4
MAX_META_DEPTH = 8
# Numbers every JSON client round-trips: `ts` within JavaScript's exact integers (epoch ms until the year 287396),
# meta's numbers within a signed 64-bit integer's range. Beyond, orjson (tierflow's serializer) cannot write
# them and other parsers silently round them.
MAX_TS = 2**53 - 1
MAX_INT64 = 2**63 - 1
MAX_META_NUMBER = MAX_INT64
ImageMime = Literal["image/png", "image/jpeg", "image/webp"]
Script = Literal["zh", "en", "other", "none"]

# NaN and Infinity are not JSON (pydantic's parser reads them, and 1e400 as infinity): no model takes them.
_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
# Routed records are written by ingest alone: as strictly typed as schemas/routed.v1.json (no "no" for false, no
# "0.5" for 0.5), so a record the schema rejects is dead-lettered, not answered.
_ROUTED = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
# Counts, versions and epoch-ms times on a tier topic: what a signed 64-bit integer holds (Kafka's timestamps,
# orjson's integers); beyond, a worker could not write its answer.
Count = Annotated[int, Field(ge=0, le=MAX_INT64)]
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


class EscalatedFrom(BaseModel):
    """The light tier's verdict carried along when it escalates a request."""

    model_config = _ROUTED
    tier: Tier
    intent: str
    confidence: float
    model: str
    inference_ms: float


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


class Timings(BaseModel):
    model_config = _STRICT
    ingest: float
    queue: float
    inference: float
    total: float


class Answer(BaseModel):
    """The final answer for a request (schemas/answer.v1.json)."""

    model_config = _STRICT
    request_id: str
    user_id: str | None
    answer: str
    intent: str
    confidence: Annotated[float, Field(ge=0.0, le=1.0)]
    tier: Tier
    model: str
    escalated: bool
    degraded: bool
    route_reason: str
    timings_ms: Timings
    replay: bool
    threshold_version: int
    lang: str | None = None
    answered_at: int | None = None


class Stamps(BaseModel):
    model_config = _STRICT
    received: int
    ingested: int
    dequeued: int
    inferred: int
    produced: int


class Result(Answer):
    """One model stage's full record (schemas/result.v1.json) on tierflow.results."""

    final: bool
    stage: Tier
    shadow: bool
    features: Features
    timestamps: Stamps
    batch_size: int
    worker_id: str
    label: str | None = None
    light_intent: str | None = None
    light_confidence: float | None = None

    def to_answer(self) -> Answer:
        return Answer.model_validate(self.model_dump(include=set(Answer.model_fields)))


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


_FAST_KEYS = frozenset({"id", "text", "user_id", "lang", "ts", "label"})


def fast_request(raw: bytes) -> dict[str, Any] | None:
    """The request as a dict when it is plainly valid, else None (then `decode_request` decides and explains).

    The ingest hot path: a text-only request that passes these checks is valid under
    schemas/request.v1.json (tests/unit/contracts/test_contracts.py checks this against the schema and the model);
    anything rarer (images, meta, odd numbers) takes the full pydantic path.
    """
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return d if type(d) is dict and _plain_request(d) else None


def _plain_request(d: dict[str, Any]) -> bool:
    if not _FAST_KEYS.issuperset(d):
        return False
    rid, text = d.get("id"), d.get("text")
    if type(rid) is not str or not 0 < len(rid) <= 128 or type(text) is not str or not 0 < len(text) <= MAX_TEXT_CHARS:
        return False
    if len(d) > 2:  # optional fields, unrolled: this runs once per message
        v = d.get("user_id", "")
        if type(v) is not str or (not 0 < len(v) <= 128 and "user_id" in d):
            return False
        v = d.get("lang", "")
        if type(v) is not str or (not 0 < len(v) <= 16 and "lang" in d):
            return False
        v = d.get("label", "")
        if type(v) is not str or (not 0 < len(v) <= 128 and "label" in d):
            return False
        v = d.get("ts", 0)
        if type(v) is not int or not 0 <= v <= MAX_TS:
            return False
    return True


# The schema requires replay and shadow (the model defaults them): the fast path accepts only what both accept.
_ROUTED_REQUIRED = frozenset(k for k, f in RoutedRequest.model_fields.items() if f.is_required()) | {"replay", "shadow"}
_ROUTED_FAST_KEYS = frozenset(RoutedRequest.model_fields) - {"escalated_from"}
_FEATURE_TYPES = tuple((k, int if k in ("chars", "tokens", "image_bytes") else bool if f.annotation is bool else str)
                       for k, f in Features.model_fields.items())
_FEATURE_KEYS = frozenset(Features.model_fields)
_SCRIPTS = frozenset(get_args(Script))
_TIERS = frozenset(t.value for t in Tier)


def fast_routed(raw: bytes) -> dict[str, Any] | None:
    """A routed record (schemas/routed.v1.json) as a dict when it is plainly valid, else None.

    The workers' hot path, as `fast_request` is ingest's: a text-only record as ingest writes it passes
    (tests/unit/contracts/test_contracts.py checks that whatever passes, `RoutedRequest` accepts with the same
    values); escalations, images and anything odd take `decode_model(RoutedRequest, raw)`.
    """
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(d) is not dict or not _ROUTED_FAST_KEYS.issuperset(d) or not _ROUTED_REQUIRED.issubset(d):
        return None
    req, f = d["request"], d["features"]
    if type(req) is not dict or not _plain_request(req) or type(f) is not dict or f.keys() != _FEATURE_KEYS:
        return None
    for k, t in _FEATURE_TYPES:
        if type(f[k]) is not t:
            return None
    if (f["script"] not in _SCRIPTS or not 0 <= f["chars"] <= MAX_INT64 or not 0 <= f["tokens"] <= MAX_INT64
            or not 0 <= f["image_bytes"] <= MAX_INT64 or d["tier"] not in _TIERS or type(d["route_reason"]) is not str
            or type(d["degraded"]) is not bool):
        return None
    v, e, r, i = d["threshold_version"], d["escalate_below"], d["received_ms"], d["ingested_ms"]
    if (type(v) is not int or not 0 <= v <= MAX_INT64 or type(e) is not float or not 0.0 <= e <= 1.0
            or type(r) is not int or not 0 <= r <= MAX_INT64 or type(i) is not int or not 0 <= i <= MAX_INT64):
        return None
    if type(d["replay"]) is not bool or type(d["shadow"]) is not bool:
        return None
    if len(d) > len(_ROUTED_REQUIRED) and (type(d.get("replay_force", False)) is not bool
                                           or type(d.get("replay_job", "")) is not str):
        return None
    return d


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

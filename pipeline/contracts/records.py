"""Typed records that cross process boundaries, with one builder and one reader per kind, and the byte-level
fast paths that decode them.

TypedDicts cost nothing at run time (a record stays a plain dict, as orjson reads and writes it); the type checker
finds every reader of a field that changes. The builders are plain functions returning dict literals: no
validation and no copies on the hot paths (ingest's ~100k msg/s, the worker's echo pipeline). Validation is the
slow path's: `pipeline/contracts/models.py` (pydantic models of requests and routed records, and TypeAdapters of
the Answer and Result below), checked against `schemas/` by tests/unit/contracts/.

The kinds: the routed record (`Routed`, schemas/routed.v1.json, ingest -> workers), the answer (`Answer`,
answer.v1.json, workers -> customers), the result (`Result`: the answer plus the stage's `ResultDetails`,
result.v1.json, workers -> feedback, status, report, replay), the hand-over (`Handover`, handover.v1.json, workers
-> a human agents' desk) and the heartbeat (`Heartbeat`, Redis only).
Adding a field to the answer is three edits: answer.v1.json, `Answer`, `answer()` (the result extends both).
"""

# No `from __future__ import annotations` here: TypedDict reads NotRequired[...] from evaluated annotations only
# (the fast paths' key sets and pydantic's TypeAdapters depend on which keys are required).
from typing import Annotated, Any, Literal, NotRequired, get_args

import orjson
from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from pipeline.contracts.topics import Tier

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

# What pydantic checks when the slow path validates a record (TypeAdapter in models.py); nothing at run time.
# NaN and Infinity are not JSON: no record takes them.
_CLOSED = ConfigDict(extra="forbid", allow_inf_nan=False)
# Counts, versions and epoch-ms times: what a signed 64-bit integer holds (Kafka's timestamps, orjson's integers).
Count = Annotated[int, Field(ge=0, le=MAX_INT64)]
Ms = Annotated[float, Field(ge=0)]
EpochMs = Annotated[int, Field(ge=0)]


# --------------------------------------------------------------------------- the routed record
class Image(TypedDict):
    data: str
    mime: ImageMime


class RequestRecord(TypedDict):
    """A customer message as a dict (schemas/request.v1.json; `models.Request` validates it)."""

    id: str
    text: NotRequired[str]
    user_id: NotRequired[str]
    image: NotRequired[Image]
    lang: NotRequired[str]
    ts: NotRequired[int]
    label: NotRequired[str]
    meta: NotRequired[dict[str, Any]]
    conversation_id: NotRequired[str]


@with_config(_CLOSED)
class Features(TypedDict):
    """What the router knows of a request (pipeline/core/features.py computes it)."""

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
    # The length routing compares with `length_threshold`, in English-equivalent characters: a Han, kana or hangul
    # character counts WIDE_CHAR_WEIGHT (pipeline/core/features.py). Absent from records written before it: `chars`.
    length: NotRequired[Count]


class EscalatedFrom(TypedDict):
    """The light tier's verdict carried along when it escalates a request."""

    tier: Tier
    intent: str
    confidence: float
    model: str
    inference_ms: float
    oos_score: NotRequired[float]  # its out-of-scope score (absent: a model that gives none)
    abstained: NotRequired[bool]  # escalated because the score was over `abstain_above`, not for low confidence


# --------------------------------------------------------------------------- conversations
@with_config(_CLOSED)
class PastTurn(TypedDict):
    """An earlier turn of the customer's conversation as the stages see it (text and answer cut short)."""

    text: str
    lang: str
    intent: NotRequired[str]  # absent: not answered yet when this message was routed
    answer: NotRequired[str]


@with_config(_CLOSED)
class Context(TypedDict):
    """What the conversation adds to a routed record (pipeline/core/conversation.py builds it at ingest).

    `topic`: the intent of the last answered turn (absent: none, or small talk closed it); `topic_turns`: how many
    answered turns in a row were on it; `unresolved`: how many of those said the answer had not helped (the
    customer restated the topic, or wrote "still" / "还是"); `complaints`: complaining turns in a row before this
    one. `slots`: what the conversation named so far (this message's included), the latest value of each."""

    conversation_id: Annotated[str, Field(min_length=1, max_length=160)]
    turn: Annotated[int, Field(ge=1)]
    history: list[PastTurn]
    slots: dict[str, str]
    follow_up: bool  # this message reads as a continuation of the last turn (a slot, "and if ...?")
    unresolved_marker: bool  # this message says an earlier answer did not help
    topic: NotRequired[str]
    topic_turns: Count
    unresolved: Count
    complaints: Count


class Turn(TypedDict):
    """One turn as the conversation store keeps it (pipeline/adapters/conversations.py): written by ingest when it
    routes the message, completed by the worker that answers it (`intent`, `tier`, `answer`, `unresolved`)."""

    id: str
    conversation_id: str
    at: int  # epoch ms received
    text: str
    lang: str
    slots: dict[str, str]
    follow_up: bool
    complaint: bool
    unresolved: bool
    intent: NotRequired[str]
    tier: NotRequired[str]
    answer: NotRequired[str]


class RoutedFields(TypedDict):
    """A routed record but its request (which travels as the producer's own, already validated, JSON bytes)."""

    features: Features
    tier: Tier
    route_reason: str
    degraded: bool
    threshold_version: int
    escalate_below: float
    received_ms: int
    ingested_ms: int
    replay: bool
    shadow: bool
    escalated_from: NotRequired[EscalatedFrom]
    replay_job: NotRequired[str]
    replay_force: NotRequired[bool]
    # Out-of-scope thresholds (absent: never abstain, as before they existed): a light score over `abstain_above`
    # escalates; a final stage's score over `handover_above` hands the request over to a person.
    abstain_above: NotRequired[float]
    handover_above: NotRequired[float]
    # The customer's conversation so far (absent: no user id, or stateless settings); `handover` set by ingest when
    # the conversation itself asks for a person (the final stage hands over, the conversation attached).
    context: NotRequired[Context]
    handover: NotRequired[str]


class Routed(RoutedFields):
    """A validated request with its features and route (schemas/routed.v1.json), on a tier topic: what ingest
    writes and a worker reads (`fast_routed`, or `models.RoutedRequest` dumped without its nulls)."""

    request: RequestRecord


def routed_fields(features: Features, tier: Tier, route_reason: str, degraded: bool, threshold_version: int,
                  escalate_below: float, received_ms: int, ingested_ms: int, abstain_above: float = 1.0,
                  handover_above: float = 1.0) -> RoutedFields:
    """The routed record's fields but the request, of a live record (`replayed` marks a backfill's)."""
    return {
        "features": features,
        "tier": tier,
        "route_reason": route_reason,
        "degraded": degraded,
        "threshold_version": threshold_version,
        "escalate_below": escalate_below,
        "received_ms": received_ms,
        "ingested_ms": ingested_ms,
        "replay": False,
        "shadow": False,
        "abstain_above": abstain_above,
        "handover_above": handover_above,
    }


def replayed(fields: RoutedFields, job: str, force: bool) -> RoutedFields:
    """`fields` marked as sent by replay job `job` (`force`: answer again ids a replay already answered)."""
    fields["replay"], fields["replay_job"], fields["replay_force"] = True, job, force
    return fields


def dump_routed(raw_request: bytes, fields: RoutedFields) -> bytes:
    """schemas/routed.v1.json bytes: the validated request's own JSON, then the routing fields."""
    return b'{"request":' + raw_request + b"," + orjson.dumps(fields)[1:]


def with_context(routed_json: bytes, ctx: Context | None, handover: str | None = None) -> bytes:
    """A routed record's bytes with its conversation (and ingest's hand-over wish) added."""
    if ctx is None:
        return routed_json
    extra = b',"context":' + orjson.dumps(ctx)
    if handover is not None:
        extra += b',"handover":' + orjson.dumps(handover)
    return routed_json[:-1] + extra + b"}"


_FEATURES_JSON = (b'{"chars":%d,"tokens":%d,"script":%b,"lang":%b,"has_image":%b,"image_bytes":%d,"vip":%b,'
                  b'"question":%b,"complaint":%b,"urgent":%b,"length":%d}')
_JSON_BOOL = (b"false", b"true")  # indexed by a bool
_SCRIPT_JSON = {s: orjson.dumps(s) for s in get_args(Script)}
_LANG_JSON = {s: orjson.dumps(s) for s in ("en", "zh", "other", "ja", "ko", "fr", "de", "es")}


class RoutedBatch:
    """The routed record's writer on ingest's hot path: `dump_routed` for one batch, pre-serialised, so that per
    message only the request's bytes, its features and received_ms are joined (tests check both agree)."""

    __slots__ = ("tail",)

    def __init__(self, threshold_version: int, escalate_below: float, ingested_ms: int, abstain_above: float = 1.0,
                 handover_above: float = 1.0) -> None:
        self.tail = orjson.dumps({"threshold_version": threshold_version, "escalate_below": escalate_below,
                                  "ingested_ms": ingested_ms, "replay": False, "shadow": False,
                                  "abstain_above": abstain_above, "handover_above": handover_above})[1:]

    @staticmethod
    def route(tier: Tier, route_reason: str, degraded: bool) -> bytes:
        """A route's fields, serialised once per batch and route."""
        return orjson.dumps({"tier": tier, "route_reason": route_reason, "degraded": degraded})[1:-1] + b","

    @staticmethod
    def features(f: Features) -> bytes:
        """`orjson.dumps(f)` for a Features dict in its declared key order, a quarter of its cost: one bytes
        formatting with the usual strings pre-encoded (tests check both agree, whatever the values)."""
        lang = f["lang"]
        return _FEATURES_JSON % (f["chars"], f["tokens"], _SCRIPT_JSON.get(f["script"]) or orjson.dumps(f["script"]),
                                 _LANG_JSON.get(lang) or orjson.dumps(lang), _JSON_BOOL[f["has_image"]],
                                 f["image_bytes"], _JSON_BOOL[f["vip"]], _JSON_BOOL[f["question"]],
                                 _JSON_BOOL[f["complaint"]], _JSON_BOOL[f["urgent"]], f.get("length", f["chars"]))

    def dump(self, raw_request: bytes, features_json: bytes, received_ms: int, route: bytes) -> bytes:
        return b"".join((b'{"request":', raw_request, b',"features":', features_json, b',"received_ms":',
                         b"%d," % received_ms, route, self.tail))


def escalation(d: Routed, tier: Tier, intent: str, confidence: float, model: str, inference_ms: float,
               oos_score: float = 0.0, abstained: bool = False) -> Routed:
    """`d` forwarded to the heavy tier with the verdict of `tier`, which was not confident enough (or `abstained`:
    judged the message out of its scope)."""
    return {**d, "tier": Tier.HEAVY, "route_reason": f"{d['route_reason']}:{'abstained' if abstained else 'escalated'}",
            "escalated_from": {"tier": tier, "intent": intent, "confidence": float(confidence), "model": model,
                               "inference_ms": round(inference_ms, 3), "oos_score": round(float(oos_score), 4),
                               "abstained": abstained}}


# --------------------------------------------------------------------------- the answer and the result
@with_config(_CLOSED)
class Timings(TypedDict):
    """Where an answer's time went, ms: ingest, the tier topic, inference (light's included when escalated), and
    from received to produced; `write`: of inference, the heavy tier's writer's (absent where none wrote);
    `writer_wait`: the writer's time on other requests' replies that this one waited through (absent where none)."""

    ingest: Ms
    queue: Ms
    inference: Ms
    total: Ms
    write: NotRequired[Ms]
    writer_wait: NotRequired[Ms]


@with_config(_CLOSED)
class Answer(TypedDict):
    """The final answer for a request (schemas/answer.v1.json), on tierflow.answers."""

    request_id: Annotated[str, Field(min_length=1, max_length=128)]
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
    threshold_version: Annotated[int, Field(ge=0)]
    lang: NotRequired[str]
    answered_at: NotRequired[EpochMs]
    fallback: NotRequired[bool]  # the writer's reply was not sent: the template was (why: fallback_reason)
    fallback_reason: NotRequired[str]
    handover: NotRequired[bool]  # handed over to a person: `answer` is the holding message (why: handover_reason)
    handover_reason: NotRequired[str]
    # The customer's conversation: its id, this message's turn in it, and what of it the answer used (e.g.
    # "previous_turn" for a follow-up read with the turn before, "slot:order_id" for an order named earlier)
    conversation_id: NotRequired[str]
    turn: NotRequired[Annotated[int, Field(ge=1)]]
    context_used: NotRequired[list[str]]


@with_config(_CLOSED)
class Stamps(TypedDict):
    """Epoch ms at each stage."""

    received: EpochMs
    ingested: EpochMs
    dequeued: EpochMs
    inferred: EpochMs
    produced: EpochMs


@with_config(_CLOSED)
class ResultDetails(TypedDict):
    """What a result adds to its answer: the stage's details."""

    final: bool
    stage: Tier
    shadow: bool
    features: Features
    timestamps: Stamps
    batch_size: Annotated[int, Field(ge=1)]
    worker_id: str
    label: NotRequired[str | None]
    light_intent: NotRequired[str | None]
    light_confidence: NotRequired[float | None]
    oos_score: NotRequired[Annotated[float, Field(ge=0.0, le=1.0)]]  # the score it decided on (cascade.scope_score)
    abstained: NotRequired[bool]  # the score was over the stage's threshold (light: escalated; else: handed over)


@with_config(_CLOSED)
class Result(Answer, ResultDetails):
    """One model stage's full record (schemas/result.v1.json) on tierflow.results: its answer (empty text when it
    escalated) and the stage's details."""


def answer(d: Routed, tier: Tier, text: str, intent: str, confidence: float, model: str, inference_ms: float,
           dequeued: int, produced: int, fallback: str | None = None, handover: str | None = None,
           write_ms: float = 0.0, writer_wait_ms: float = 0.0) -> Answer:
    """The answer of `tier` to the routed record `d` (times in epoch ms; `inference_ms` of this stage; `fallback`:
    why a writer's reply was replaced by the template, if it was; `handover`: why the request went to a person,
    `text` then being the holding message; `write_ms`: of `inference_ms`, the writer's on this request's batch;
    `writer_wait_ms`: the writer's time on other requests' replies while this one waited).

    Durations between two hosts' clocks are never negative.
    """
    esc = d.get("escalated_from")
    req = d["request"]
    received, ingested = d["received_ms"], d["ingested_ms"]
    out: Answer = {
        "request_id": req["id"],
        "user_id": req.get("user_id"),
        "answer": text,
        "intent": intent,
        "confidence": min(1.0, max(0.0, float(confidence))),
        "tier": tier,
        "model": model,
        "escalated": esc is not None,
        "degraded": d["degraded"],
        "route_reason": d["route_reason"],
        "timings_ms": {
            "ingest": ingested - received if ingested > received else 0,
            "queue": dequeued - ingested if dequeued > ingested else 0,
            "inference": round(inference_ms + (esc["inference_ms"] if esc else 0.0), 3),
            "total": produced - received if produced > received else 0,
        },
        "replay": d["replay"],
        "threshold_version": d["threshold_version"],
        "lang": d["features"]["lang"],
        "answered_at": produced,
    }
    if write_ms > 0:
        out["timings_ms"]["write"] = round(write_ms, 3)
    if writer_wait_ms > 0:
        out["timings_ms"]["writer_wait"] = round(writer_wait_ms, 3)
    ctx = d.get("context")
    if ctx is not None:
        out["conversation_id"], out["turn"], out["context_used"] = ctx["conversation_id"], ctx["turn"], []
    if fallback is not None:
        out["fallback"], out["fallback_reason"] = True, fallback
    if handover is not None:
        out["handover"], out["handover_reason"] = True, handover
    return out


def result_details(d: Routed, stage: Tier, final: bool, dequeued: int, inferred: int, produced: int,
                   batch_size: int, worker_id: str, oos_score: float = 0.0, abstained: bool = False) -> ResultDetails:
    """The details of stage `stage` on `d` (`final`: its answer is the one sent; times in epoch ms; `oos_score`:
    the stage's out-of-scope score, `abstained`: over its threshold)."""
    esc = d.get("escalated_from")
    return {
        "final": final,
        "stage": stage,
        "shadow": d["shadow"],
        "features": d["features"],
        "timestamps": {"received": d["received_ms"], "ingested": d["ingested_ms"], "dequeued": dequeued,
                       "inferred": inferred, "produced": produced},
        "batch_size": batch_size,
        "worker_id": worker_id,
        "label": d["request"].get("label"),
        "light_intent": esc["intent"] if esc else None,
        "light_confidence": esc["confidence"] if esc else None,
        "oos_score": min(1.0, max(0.0, round(float(oos_score), 4))),
        "abstained": abstained,
    }


def dump_answer_and_result(a: Answer, details: ResultDetails) -> tuple[bytes, bytes]:
    """(answer bytes, result bytes): the result is the serialised answer extended by the details, not rebuilt."""
    answer_json = orjson.dumps(a)
    return answer_json, answer_json[:-1] + b"," + orjson.dumps(details)[1:]


# --------------------------------------------------------------------------- the hand-over
Score = Annotated[float, Field(ge=0.0, le=1.0)]


@with_config(_CLOSED)
class Handover(TypedDict):
    """A request handed over to a person (schemas/handover.v1.json), on tierflow.handover: all a human agents' desk
    needs to pick it up without reading another topic (an image stays on tierflow.requests, found by id).

    The customer already has the holding message (the answer record with `handover` true, same request id).
    """

    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    user_id: str | None
    text: str
    lang: str
    has_image: bool
    reason: str
    oos_score: Score
    handover_above: Score
    tier: Tier
    model: str
    intent: str  # the nearest known intent: what would have been answered
    confidence: Score
    light_intent: str | None
    light_confidence: float | None
    holding_message: str
    route_reason: str
    degraded: bool
    replay: bool
    threshold_version: Annotated[int, Field(ge=0)]
    received_at: EpochMs
    handed_over_at: EpochMs
    conversation: NotRequired[list[PastTurn]]  # the turns before this one, oldest first (absent: no conversation)
    slots: NotRequired[dict[str, str]]


def handover(d: Routed, a: Answer, oos_score: float) -> Handover:
    """The hand-over record of `d`, whose answer `a` (`handover` set) holds the customer meanwhile."""
    esc = d.get("escalated_from")
    req = d["request"]
    out: Handover = {
        "request_id": a["request_id"],
        "user_id": a["user_id"],
        "text": req.get("text", ""),
        "lang": d["features"]["lang"],
        "has_image": d["features"]["has_image"],
        "reason": a.get("handover_reason", "out_of_scope"),
        "oos_score": min(1.0, max(0.0, round(float(oos_score), 4))),
        "handover_above": d.get("handover_above", 1.0),
        "tier": a["tier"],
        "model": a["model"],
        "intent": a["intent"],
        "confidence": a["confidence"],
        "light_intent": esc["intent"] if esc else None,
        "light_confidence": esc["confidence"] if esc else None,
        "holding_message": a["answer"],
        "route_reason": a["route_reason"],
        "degraded": a["degraded"],
        "replay": a["replay"],
        "threshold_version": a["threshold_version"],
        "received_at": d["received_ms"],
        "handed_over_at": a.get("answered_at", d["received_ms"]),
    }
    ctx = d.get("context")
    if ctx is not None:  # the desk reads the conversation without asking the store
        out["conversation"], out["slots"] = ctx["history"], ctx["slots"]
    return out


@with_config(_CLOSED)
class AnswerDraft(TypedDict):
    """A written answer so far (schemas/answer_draft.v1.json), on tierflow.answers.drafts: the heavy tier's writer
    publishes one each time its reply completes a sentence, for a chat widget to show at once. Best effort and
    outside the worker's transaction (a draft waiting for the batch's commit would come after the answer); the
    final answer, exactly once, is the one on tierflow.answers, and may differ (the template, when the guard does
    not send the written reply)."""

    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    user_id: str | None
    seq: Annotated[int, Field(ge=0)]  # 0, 1, ...: each draft holds the whole text so far, the last one the most
    text: str
    lang: str
    at: EpochMs


def answer_draft(d: Routed, seq: int, text: str, at_ms: int) -> AnswerDraft:
    """Draft `seq` of the written answer to `d`: `text`, the reply so far."""
    req = d["request"]
    return {"request_id": req["id"], "user_id": req.get("user_id"), "seq": seq, "text": text,
            "lang": d["features"]["lang"], "at": at_ms}


def answer_draft_of(raw: bytes | None) -> AnswerDraft | None:
    """The one reader of tierflow.answers.drafts (fields read as `answer_of` says)."""
    return _object(raw)  # type: ignore[return-value]


def handover_of(raw: bytes | None) -> Handover | None:
    """The one reader of tierflow.handover (fields read as `answer_of` says)."""
    return _object(raw)  # type: ignore[return-value]


def answer_of(raw: bytes | None) -> Answer | None:
    """The one reader of tierflow.answers: the record as a dict; None for bytes that are not a JSON object.

    Fields are not checked (a record no worker wrote may lack any): required ones are read as `a[...]` where a
    reader refuses what lacks them, optional ones (and, by tolerant readers, any) with `.get`.
    """
    d = _object(raw)
    return d  # type: ignore[return-value]


def result_of(raw: bytes | None) -> Result | None:
    """The one reader of tierflow.results: the record as a dict; None for bytes that are not a JSON object (fields
    are read as `answer_of` says)."""
    d = _object(raw)
    return d  # type: ignore[return-value]


def _object(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return d if isinstance(d, dict) else None


# --------------------------------------------------------------------------- fast paths
_FAST_KEYS = frozenset({"id", "text", "user_id", "lang", "ts", "label"})


def fast_request(raw: bytes) -> RequestRecord | None:
    """The request as a dict when it is plainly valid, else None (then `models.decode_request` decides and explains).

    The ingest hot path: a text-only request that passes these checks is valid under
    schemas/request.v1.json (tests/unit/contracts/test_records.py checks this against the schema and the model);
    anything rarer (images, meta, odd numbers) takes the full pydantic path.
    """
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return d if type(d) is dict and _plain_request(d) else None  # type: ignore[return-value]


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


# The schema requires replay and shadow: the fast path too. Escalations take the full model.
_ROUTED_REQUIRED = Routed.__required_keys__
# Escalations and records with a conversation (its nested turns are validated by the model) take the full model.
_ROUTED_FAST_KEYS = frozenset(Routed.__annotations__) - {"escalated_from", "context", "handover"}
_FEATURE_TYPES = tuple((k, int if k in ("chars", "tokens", "image_bytes", "length") else str if k in ("script", "lang")
                        else bool)
                       for k in Features.__annotations__)
_FEATURE_KEYS = frozenset(Features.__annotations__)
_SCRIPTS = frozenset(get_args(Script))
_TIERS = frozenset(t.value for t in Tier)


def fast_routed(raw: bytes) -> Routed | None:
    """A routed record (schemas/routed.v1.json) as a dict when it is plainly valid, else None.

    The workers' hot path, as `fast_request` is ingest's: a text-only record as ingest writes it passes
    (tests/unit/contracts/test_records.py checks that whatever passes, `models.RoutedRequest` accepts with the
    same values); escalations, images and anything odd take `models.decode_model(RoutedRequest, raw)`.
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
            or not 0 <= f["length"] <= MAX_INT64
            or not 0 <= f["image_bytes"] <= MAX_INT64 or d["tier"] not in _TIERS or type(d["route_reason"]) is not str
            or type(d["degraded"]) is not bool):
        return None
    v, e, r, i = d["threshold_version"], d["escalate_below"], d["received_ms"], d["ingested_ms"]
    if (type(v) is not int or not 0 <= v <= MAX_INT64 or type(e) is not float or not 0.0 <= e <= 1.0
            or type(r) is not int or not 0 <= r <= MAX_INT64 or type(i) is not int or not 0 <= i <= MAX_INT64):
        return None
    if type(d["replay"]) is not bool or type(d["shadow"]) is not bool:
        return None
    if len(d) > len(_ROUTED_REQUIRED):
        if type(d.get("replay_force", False)) is not bool or type(d.get("replay_job", "")) is not str:
            return None
        a, h = d.get("abstain_above", 1.0), d.get("handover_above", 1.0)
        if type(a) is not float or not 0.0 <= a <= 1.0 or type(h) is not float or not 0.0 <= h <= 1.0:
            return None
    return d  # type: ignore[return-value]


# --------------------------------------------------------------------------- the heartbeat
class Heartbeat(TypedDict):
    """A worker's (or agent's) health, written every `heartbeat_interval_s` under `Keys.heartbeat(tier, id)`.

    Latencies are of answers, in ms over the last few seconds: `p95_ms` of all of them, `live_p95_ms` of live
    ones only (replays excluded) and `live_recent_*` of the last `RECENT_S`. `busy_ms`: how long the batch in hand
    has taken so far (0 between batches). `up_s`: seconds since the process announced itself; a worker writes its
    first heartbeat (`ready` false) before it loads its model, so readers know a start-up is in progress
    (pipeline/core/health.py). Agents that are not workers (ingest, feedback) fill only `agent` and
    `ready` (and ingest `consumed`); their tier is `agent`.

    Health decisions (ingest's degrade, the controller's shed and restore) read `live_p95_ms` and `busy_ms`: the
    SLO is the live customers'; a replay's backlog is paced by the replay's own guard and must not degrade live
    traffic to light. `p95_ms` is shown by `tierflow status` (what the workers do, all of it).
    """

    ts: float
    worker: str
    tier: str
    agent: str
    ready: bool
    up_s: float
    lag: int
    p95_ms: float
    live_p95_ms: float
    live_recent_p95_ms: float
    live_recent_n: int
    busy_ms: float
    processed: int
    consumed: int
    model: str
    device: str


_DEFAULTS: Heartbeat = {"ts": 0.0, "worker": "?", "tier": "?", "agent": "", "ready": False, "up_s": 0.0, "lag": 0,
                        "p95_ms": 0.0, "live_p95_ms": 0.0, "live_recent_p95_ms": 0.0, "live_recent_n": 0,
                        "busy_ms": 0.0, "processed": 0, "consumed": 0, "model": "?", "device": "?"}
_TYPES: dict[str, type] = {k: type(v) for k, v in _DEFAULTS.items()}


def heartbeat(**fields: Any) -> Heartbeat:
    """The one builder: every field present, of its type (missing ones at their defaults)."""
    unknown = set(fields) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"heartbeat: unknown fields {sorted(unknown)}")
    return heartbeat_of_dict(fields)


def heartbeat_of_dict(d: dict[str, Any]) -> Heartbeat:
    out: dict[str, Any] = dict(_DEFAULTS)
    for k, kind in _TYPES.items():
        v = d.get(k)
        if v is None:
            continue
        out[k] = bool(v) if kind is bool else kind(v)
    return out  # type: ignore[return-value]


def heartbeat_of(raw: bytes | str) -> Heartbeat | None:
    """The one reader: a heartbeat from Redis, every field present; None for one that is not (logged by no one:
    a heartbeat expires by itself within seconds, and the next beat overwrites it)."""
    try:
        d = orjson.loads(raw)
        return heartbeat_of_dict(d) if isinstance(d, dict) else None
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None


def dump_heartbeat(hb: Heartbeat) -> bytes:
    return orjson.dumps(hb)

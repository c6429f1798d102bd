"""Malformed requests, generated with hypothesis: every one must end on the DLQ with a reason.

Each strategy yields `(category, raw bytes or None)`. Nothing here is schema-valid: JSON-shaped cases are
checked against schemas/request.v1.json, and the image cases are valid JSON whose image bytes are not a
decodable image within limits (ingest checks magic bytes and size; the multimodal worker decodes).

Numbers are varied out of every range (`ts` beyond 2^53 - 1 or negative, `meta` values nested a few levels deep
beyond ±(2^63 - 1), NaN/Infinity literals, floats beyond a double written as text), for ingest and for routed
records written straight to a tier topic (`ROUTED_POISON`, checked against schemas/routed.v1.json). `envelopes`
varies what a record carries besides its value: null, empty, huge and non-UTF-8 keys, and many, huge,
non-UTF-8 and duplicated headers.
"""

from __future__ import annotations

import base64
import json
import random
import struct
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from hypothesis import strategies as st

import schemas
from pipeline.adapters.kafka import Headers, record_parts
from pipeline.contracts.records import MAX_IMAGE_BYTES, MAX_META_DEPTH, MAX_META_NUMBER, MAX_TEXT_CHARS, MAX_TS
from tests.faults.harness import Envelope

Poison = tuple[str, bytes | None]
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "request.v1.json"
# Which stage must catch a category: everything at ingest except images only a decoder can judge.
WORKER_CATEGORIES = frozenset({"image_bomb", "corrupt_image"})


def dumps(value: Any) -> bytes:
    """Compact JSON bytes; the stdlib encoder, since hypothesis draws integers beyond 64 bits (and it writes the
    NaN and Infinity literals, which are not JSON, for floats that are not finite)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))


def schema_invalid(doc: Any) -> bool:
    return not _validator().is_valid(doc)


ids = st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=24)
texts = st.text(min_size=1, max_size=60)
base = st.fixed_dictionaries({"id": ids, "text": texts},
                             optional={"user_id": ids, "lang": st.sampled_from(["en", "zh", "fr"]),
                                       "ts": st.integers(0, 2**41)})


# --------------------------------------------------------------------------- images
def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def png(width: int, height: int, idat: bytes = b"\0" * 64, bad_crc: bool = False) -> bytes:
    """A PNG whose header declares `width` x `height` (RGB, 8 bit) over a tiny IDAT: nothing to back it."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = _chunk(b"IDAT", zlib.compress(idat))
    if bad_crc:
        data = data[:-4] + bytes(b ^ 0xFF for b in data[-4:])
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + data + _chunk(b"IEND", b"")


def jpeg(width: int, height: int) -> bytes:
    """A baseline JPEG header (SOF0, 3 components) declaring `width` x `height`, then a few bytes of scan."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x11\x00\x02\x11\x01\x03\x11\x01"
    sos = b"\xff\xda" + struct.pack(">H", 12) + b"\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00"
    return b"\xff\xd8" + sof + sos + b"\x00" * 32 + b"\xff\xd9"


def webp(width: int, height: int) -> bytes:
    """An extended WebP (VP8X) declaring a `width` x `height` canvas and no image data."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0" + (width - 1).to_bytes(3, "little") + \
        (height - 1).to_bytes(3, "little")
    body = b"WEBP" + vp8x
    return b"RIFF" + struct.pack("<I", len(body)) + body


MIMES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@st.composite
def image_bombs(draw: st.DrawFn) -> Poison:
    """Headers declaring more pixels than `max_image_pixels` (20 M) — up to 100,000 x 100,000 for PNG."""
    fmt = draw(st.sampled_from(["png", "jpeg", "webp"]))
    limit = {"png": 100_000, "jpeg": 65_535, "webp": 16_384}[fmt]
    width = draw(st.integers(4_473, limit))
    height = draw(st.integers(-(-20_000_001 // width), limit))  # width * height > 20,000,000
    data = {"png": png, "jpeg": jpeg, "webp": webp}[fmt](width, height)
    return "image_bomb", _with_image(draw(base), data, MIMES[fmt])


@st.composite
def corrupt_images(draw: st.DrawFn) -> Poison:
    """Small declared sizes, broken bodies: truncated PNG data, a WebP with no bitstream, a JPEG with no scan."""
    fmt = draw(st.sampled_from(["png", "jpeg", "webp"]))
    w, h = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    if fmt == "png":
        # A broken checksum: a short IDAT alone can still be a valid tiny image (1x1 needs 4 bytes).
        data = png(w, h, idat=draw(st.binary(max_size=8)), bad_crc=True)
    elif fmt == "webp":
        data = webp(w, h)
    else:
        data = jpeg(w, h)[:draw(st.integers(4, 20))] + b"\xff\xd9"
    return "corrupt_image", _with_image(draw(base), data, MIMES[fmt])


def _with_image(doc: dict[str, Any], data: bytes, mime: str) -> bytes:
    return dumps({**doc, "image": {"data": base64.b64encode(data).decode(), "mime": mime}})


# --------------------------------------------------------------------------- ingest-level poison
@st.composite
def garbage(draw: st.DrawFn) -> Poison:
    return "bad_json", draw(st.binary(min_size=1, max_size=200))


@st.composite
def truncated(draw: st.DrawFn) -> Poison:
    raw = dumps(draw(base))
    return "truncated_json", raw[:draw(st.integers(0, len(raw) - 1))]


WRONG: dict[str, st.SearchStrategy[Any]] = {
    "id": st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.just(""),
                    st.text(min_size=129, max_size=160), st.lists(st.integers(), max_size=3)),
    "text": st.one_of(st.integers(), st.booleans(), st.lists(texts, max_size=2), st.dictionaries(ids, texts,
                                                                                               max_size=2)),
    "user_id": st.one_of(st.integers(), st.just(""), st.text(min_size=129, max_size=140)),
    "lang": st.one_of(st.just(""), st.text(min_size=17, max_size=30), st.integers()),
    "label": st.one_of(st.just(""), st.integers(), st.text(min_size=129, max_size=140)),
    "ts": st.one_of(st.integers(max_value=-1), st.floats(0.5, 1e12).filter(lambda x: x != int(x)),
                    st.lists(st.integers(), max_size=2), st.booleans(), st.integers(0).map(str)),
    "meta": st.one_of(st.text(max_size=10), st.lists(st.integers(), max_size=3), st.integers()),
    "image": st.one_of(st.text(max_size=10),
                       st.fixed_dictionaries({"data": st.integers(), "mime": st.just("image/png")}),
                       st.fixed_dictionaries({"data": st.just("aGk="), "mime": st.sampled_from(
                           ["image/gif", "image/svg+xml", "text/html", ""])}),
                       st.fixed_dictionaries({"data": st.just("aGk=")})),
}


@st.composite
def wrong_types(draw: st.DrawFn) -> Poison:
    doc = draw(base)
    key = draw(st.sampled_from(sorted(WRONG)))
    doc[key] = draw(WRONG[key])
    return "wrong_type", dumps(doc)


@st.composite
def explicit_nulls(draw: st.DrawFn) -> Poison:
    doc = draw(base)
    doc[draw(st.sampled_from(["text", "user_id", "lang", "ts", "label", "meta", "image"]))] = None
    return "null_field", dumps(doc)


@st.composite
def unknown_fields(draw: st.DrawFn) -> Poison:
    doc = draw(base)
    doc[draw(st.sampled_from(["extra", "Text", "ID", "__proto__", "prompt"]))] = draw(texts)
    return "unknown_field", dumps(doc)


@st.composite
def missing_required(draw: st.DrawFn) -> Poison:
    doc = draw(base)
    if draw(st.booleans()):
        del doc["id"]
    else:
        doc["text"] = ""  # no text and no image
    return "missing_field", dumps(doc)


@st.composite
def not_objects(draw: st.DrawFn) -> Poison:
    value = draw(st.one_of(st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=5),
                           st.just(None), st.booleans()))
    return "not_object", dumps(value)


@st.composite
def huge_texts(draw: st.DrawFn) -> Poison:
    n = draw(st.integers(MAX_TEXT_CHARS + 1, 3 * MAX_TEXT_CHARS))
    char = draw(st.sampled_from(["a", "é", "卡", "😀", " "]))
    return "huge_text", dumps({**draw(base), "text": char * n})


@st.composite
def bad_base64(draw: st.DrawFn) -> Poison:
    data = draw(st.one_of(st.just("aGk"), st.just("a===="), st.text("!@#$%^&*()\n \t", min_size=1, max_size=20),
                          st.just("aGVsbG8=\n"), st.just("iVBORw0KGgo%")))
    return "bad_base64", dumps({**draw(base), "image": {"data": data, "mime": "image/png"}})


BY_CONSTRUCTION = WORKER_CATEGORIES | {"wrong_magic", "bad_base64", "oversize_image", "oversize_record",
                                       "deep_nesting"}
MAGICS = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF")


@st.composite
def wrong_magic(draw: st.DrawFn) -> Poison:
    data = draw(st.binary(max_size=64).filter(lambda b: not b.startswith(MAGICS)))
    mime = draw(st.sampled_from(sorted(MIMES.values())))
    return "wrong_magic", _with_image(draw(base), data, mime)


@st.composite
def wrong_encodings(draw: st.DrawFn) -> Poison:
    doc = {**draw(base), "text": "café ü 卡 " + draw(texts)}
    enc = draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252", "gb18030"]))
    raw = json.dumps(doc, ensure_ascii=False).encode(enc, errors="replace")
    return "wrong_encoding", raw


@st.composite
def null_bytes(draw: st.DrawFn) -> Poison:
    raw = dumps(draw(base))
    at = draw(st.integers(0, len(raw)))
    return "null_byte", raw[:at] + b"\x00" * draw(st.integers(1, 3)) + raw[at:]


@st.composite
def deep_nesting(draw: st.DrawFn) -> Poison:
    depth = draw(st.one_of(st.integers(9, 300), st.integers(1000, 1100), st.integers(5_000, 100_000)))
    opener, closer = draw(st.sampled_from([('{"a":', "}"), ("[", "]")]))
    nested = opener * depth + "1" + closer * depth
    if draw(st.booleans()):
        return "deep_nesting", nested.encode()  # at the root: not even an object
    doc = dumps(draw(base))
    return "deep_nesting", doc[:-1] + b',"meta":{"x":' + nested.encode() + b"}}"


@st.composite
def tombstones(draw: st.DrawFn) -> Poison:
    return "null_record", draw(st.sampled_from([None, b""]))


# --------------------------------------------------------------------------- numbers out of every range
NUMBER_CATEGORIES = frozenset({"ts_out_of_range", "meta_out_of_range", "non_finite", "huge_float"})
# Integers no signed 64-bit reader keeps (edges included), and floats beyond the same range.
beyond_64 = st.one_of(st.integers(MAX_META_NUMBER + 1, 2**80), st.integers(-(2**80), -MAX_META_NUMBER - 1),
                      st.sampled_from([MAX_META_NUMBER + 1, -MAX_META_NUMBER - 1, 2**64 - 1, 2**64, -(2**64),
                                       10**100]),
                      st.floats(min_value=2.0**63, max_value=1.7e308),
                      st.floats(min_value=-1.7e308, max_value=-(2.0**63)))
ts_beyond = st.one_of(st.integers(MAX_TS + 1, 2**80), st.integers(-(2**80), -1),
                      st.sampled_from([MAX_TS + 1, 2**63 - 1, 2**63, 2**64, -(2**63)]))
non_finite = st.sampled_from([float("nan"), float("inf"), float("-inf")])  # dumps: NaN, Infinity, -Infinity
# Numbers a double cannot hold, as text: JSON's grammar allows them; every parser must refuse or reject them.
HUGE_FLOAT_TEXTS = ("1e400", "-1e400", "1E+999", "123.456e1000", "-0.5e310", "9" * 400 + ".0", "1e99999")
_HUGE = "@@huge-float@@"  # where dumps' output gets the text
portable = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=4),
                     st.floats(-1e6, 1e6, allow_nan=False))


@st.composite
def nested(draw: st.DrawFn, leaf: Any, max_levels: int = 4) -> Any:
    """`leaf` inside up to `max_levels` dicts and lists, beside portable siblings (never deeper than meta may be)."""
    value = leaf
    for _ in range(draw(st.integers(0, min(max_levels, MAX_META_DEPTH - 2)))):
        if draw(st.booleans()):
            d = draw(st.dictionaries(st.text(min_size=1, max_size=4), portable, max_size=2))
            d[draw(st.text(min_size=1, max_size=6))] = value
            value = d
        else:
            items = draw(st.lists(portable, max_size=3))
            items.insert(draw(st.integers(0, len(items))), value)
            value = items
    return value


@st.composite
def meta_with(draw: st.DrawFn, leaf: Any) -> dict[str, Any]:
    meta = draw(st.dictionaries(st.text(min_size=1, max_size=4), portable, max_size=2))
    meta[draw(st.text(min_size=1, max_size=6))] = draw(nested(leaf))
    return meta


@st.composite
def ts_out_of_range(draw: st.DrawFn) -> Poison:
    return "ts_out_of_range", dumps({**draw(base), "ts": draw(ts_beyond)})


@st.composite
def meta_out_of_range(draw: st.DrawFn) -> Poison:
    return "meta_out_of_range", dumps({**draw(base), "meta": draw(meta_with(draw(beyond_64)))})


@st.composite
def non_finite_numbers(draw: st.DrawFn) -> Poison:
    """NaN, Infinity or -Infinity (not JSON, but what json.dumps writes) in meta, ts or any field."""
    doc = draw(base)
    where = draw(st.sampled_from(["meta", "ts", "id", "text", "user_id", "lang", "label"]))
    x = draw(non_finite)
    doc[where] = draw(meta_with(x)) if where == "meta" else x
    return "non_finite", dumps(doc)


@st.composite
def huge_floats(draw: st.DrawFn) -> Poison:
    """A number beyond a double (1e400), written as text, in meta (nested) or ts."""
    doc = draw(base)
    if draw(st.booleans()):
        doc["meta"] = draw(meta_with(_HUGE))
    else:
        doc["ts"] = _HUGE
    text = draw(st.sampled_from(HUGE_FLOAT_TEXTS)).encode()
    return "huge_float", dumps(doc).replace(f'"{_HUGE}"'.encode(), text)


POISON = st.one_of(garbage(), truncated(), wrong_types(), explicit_nulls(), unknown_fields(), missing_required(),
                   not_objects(), huge_texts(), bad_base64(), wrong_magic(), wrong_encodings(), null_bytes(),
                   deep_nesting(), tombstones(), image_bombs(), corrupt_images(), ts_out_of_range(),
                   meta_out_of_range(), non_finite_numbers(), huge_floats())


def _undecodable(raw: bytes) -> bool:
    """The multimodal worker's own decoder refuses the image (checked where Pillow is installed)."""
    try:
        from workers.models.ocr import load_image
    except ImportError:
        return True
    from pipeline.errors import InvalidMessage
    from pipeline.settings import Settings

    image = orjson.loads(raw)["image"]
    try:
        load_image(base64.b64decode(image["data"]), Settings().max_image_pixels)
    except InvalidMessage:
        return True
    return False


def oversize_images(n: int) -> list[Poison]:
    """Images over the 5 MB decoded limit (still under the record limit): expensive, so a few, by hand."""
    data = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * (MAX_IMAGE_BYTES + 1024)).decode()
    return [("oversize_image", dumps({"id": f"big-{i}", "text": "x", "image": {"data": data,
                                                                                       "mime": "image/png"}}))
            for i in range(n)]


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(raw: bytes) -> Any:
    """`raw` as RFC 8259 JSON, numbers exact: UTF-8 only, NaN/Infinity refused (Python's json.loads would take
    them, and a UTF-16 document), big integers kept whole, 1e400 read as infinity (what a number beyond a
    double is to a schema: over any maximum). Raises ValueError where it is not JSON."""
    return json.loads(raw.decode("utf-8"), parse_constant=_not_json)


def is_poison(category: str, raw: bytes | None) -> bool:
    """The generator's own check: a JSON-level case must be schema-invalid. Images are judged by decoders, and
    `meta` deeper than 8 levels by the contract (pipeline.contracts.models.MAX_META_DEPTH), not the schema. Numbers are
    judged exactly: NaN and Infinity are not JSON at all, 2^64 is not rounded to a double (as orjson would)."""
    if category in WORKER_CATEGORIES and raw is not None:
        return _undecodable(raw)
    if raw is None or category in BY_CONSTRUCTION:
        return True
    if category in NUMBER_CATEGORIES:
        try:
            return schema_invalid(strict_json(raw))
        except ValueError:  # NaN / Infinity: not JSON
            return category == "non_finite"
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return True
    return schema_invalid(doc)


# --------------------------------------------------------------------------- routed records (tier topics)
def routed_doc(req: dict[str, Any]) -> dict[str, Any]:
    """A routed record (schemas/routed.v1.json) as ingest writes it, around `req`."""
    return {"request": req, "features": {"chars": 2, "tokens": 1, "script": "en", "lang": "en", "has_image": False,
                                         "image_bytes": 0, "vip": False, "question": False, "complaint": False,
                                         "urgent": False},
            "tier": "light", "route_reason": "short", "degraded": False, "threshold_version": 1,
            "escalate_below": 0.5, "received_ms": 1, "ingested_ms": 1, "replay": False, "shadow": False}


ESCALATED = {"tier": "light", "intent": "card_arrival", "confidence": 0.3, "model": "echo", "inference_ms": 1.5}
ROUTED_INTS = ("received_ms", "ingested_ms", "threshold_version", "features.chars", "features.tokens",
               "features.image_bytes")
ROUTED_FLOATS = ("escalate_below", "escalated_from.confidence", "escalated_from.inference_ms")


def _put(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`doc` with `value` at a dotted `path` (an absent parent is added: escalated_from)."""
    head, _, rest = path.partition(".")
    if not rest:
        return {**doc, head: value}
    return {**doc, head: _put(dict(doc.get(head) or ESCALATED), rest, value)}


@st.composite
def routed_numbers(draw: st.DrawFn) -> Poison:
    """A routed record, valid but for one number out of range: its request's ts or meta, a time, a version or a
    feature count beyond 64 bits or negative."""
    doc = routed_doc(draw(base))
    where = draw(st.sampled_from(["request.ts", "request.meta", *ROUTED_INTS]))
    if where == "request.ts":
        value: Any = draw(ts_beyond)
    elif where == "request.meta":
        value = draw(meta_with(draw(beyond_64)))
    else:
        value = draw(st.one_of(st.integers(MAX_META_NUMBER + 1, 2**80), st.integers(-(2**80), -1),
                               st.sampled_from([MAX_META_NUMBER + 1, 2**64 - 1, 2**64])))
    return "routed_number", dumps(_put(doc, where, value))


@st.composite
def routed_non_finite(draw: st.DrawFn) -> Poison:
    """NaN / Infinity (not JSON) or a number beyond a double written as text, in any number of a routed record."""
    doc = routed_doc(draw(base))
    where = draw(st.sampled_from(["request.ts", "request.meta", *ROUTED_INTS, *ROUTED_FLOATS]))
    huge = draw(st.booleans())
    leaf: Any = _HUGE if huge else draw(non_finite)
    raw = dumps(_put(doc, where, draw(meta_with(leaf)) if where == "request.meta" else leaf))
    if huge:
        return "routed_huge_float", raw.replace(f'"{_HUGE}"'.encode(), draw(st.sampled_from(HUGE_FLOAT_TEXTS)).encode())
    return "routed_non_finite", raw


ROUTED_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "request": st.one_of(st.just({"id": "r"}), st.just([]), st.builds(lambda d: {**d, "extra": 1}, base),
                         st.builds(lambda d: {**d, "id": 7}, base)),
    "features": st.one_of(st.just({}), st.just(None), st.just({**routed_doc({})["features"], "script": "fr"}),
                          st.just({**routed_doc({})["features"], "chars": "2"})),
    "tier": st.sampled_from(["gpu", "", 1, None]),
    "degraded": st.sampled_from([0, "no", None]),
    "escalate_below": st.one_of(st.floats(1.0001, 10), st.floats(-10, -0.0001), st.just("0.5")),
    "replay": st.sampled_from([0, 1, "true", None]),
    "escalated_from": st.sampled_from([{}, {"tier": "gpu"}, "light", {**ESCALATED, "extra": 1}]),
    "extra": st.integers(),
}


@st.composite
def routed_wrong(draw: st.DrawFn) -> Poison:
    doc = routed_doc(draw(base))
    key = draw(st.sampled_from(sorted(ROUTED_WRONG)))
    doc[key] = draw(ROUTED_WRONG[key])
    if draw(st.booleans()):  # and a required field gone (replay and shadow: the model defaults them)
        doc.pop(draw(st.sampled_from(["request", "features", "tier", "received_ms", "escalate_below"])), None)
    return "routed_schema", dumps(doc)


def _routed(category: str, s: st.SearchStrategy[Poison]) -> st.SearchStrategy[Poison]:
    return s.map(lambda p: (category, p[1]))


ROUTED_POISON = st.one_of(routed_numbers(), routed_non_finite(), routed_wrong(),
                          _routed("routed_bad_json", st.one_of(garbage(), truncated(), null_bytes())),
                          _routed("routed_not_object", not_objects()), _routed("routed_null", tombstones()))


def is_routed_poison(category: str, raw: bytes | None) -> bool:
    """A routed case must be invalid under schemas/routed.v1.json (numbers judged exactly), or not JSON."""
    if raw is None:
        return True
    try:
        doc = strict_json(raw)
    except ValueError:
        return True
    return bool(list(schemas.validator("routed").iter_errors(doc)))


# --------------------------------------------------------------------------- envelopes: keys and headers
# Bytes that are never UTF-8: a 0xff, a stray continuation byte, a cut sequence, a surrogate, beyond U+10FFFF,
# an overlong encoding.
NOT_UTF8 = (b"\xff", b"\xfe\xff", b"\x80", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
            b"\xc0\xaf")
# Header names a reader may trip on: empty, non-ASCII, the DLQ's own (a dead letter must not take the record's
# word for its reason or its coordinates), a common one.
HEADER_NAMES = ("trace", "content-type", "", "名前", "ключ", "😀", "x-error", "x-error-kind", "x-source-offset",
                "x-source-topic", "x-stage")
SMALL, BIG = 64 * 1024, 1024 * 1024
# What hypothesis chooses per envelope; the bytes come from a random.Random it seeds (a strategy built per draw
# costs hypothesis milliseconds, and an envelope needs a dozen). Weights by repetition: `huge` headers over
# 64 KiB, up to ~1 MB, are one in eight of the huge ones; near-limit keys only where asked for (`huge`).
_KEY_KINDS = st.sampled_from(["null", "empty", "binary", "binary", "big"])
_VALID_KEY_KINDS = st.sampled_from(["null", "empty", "binary"])
_HEADER_KINDS = st.sampled_from(["none", "many", "huge", "binary", "dup"])
_SEEDS = st.integers(0, 2**32 - 1)


def _blob(rng: random.Random, n: int, compressible: bool) -> bytes:
    """`n` bytes: a short pattern repeated (lz4 takes it to almost nothing) or random (lz4 cannot shrink it)."""
    if compressible:
        pat = rng.randbytes(rng.randint(1, 8))
        return (pat * (n // len(pat) + 1))[:n]
    return rng.randbytes(n)


def not_utf8(rng: random.Random, max_size: int = 64) -> bytes:
    """Bytes that are not UTF-8: random ones around one of NOT_UTF8."""
    out = rng.randbytes(rng.randint(0, max_size // 2))
    at = rng.randint(0, len(out))
    return out[:at] + rng.choice(NOT_UTF8) + out[at:]


def hostile_key(rng: random.Random, kind: str, room: int) -> tuple[str, bytes | None]:
    """(label, key): null, empty, non-UTF-8, big (1-64 KiB) or huge: `room` bytes (the limit less the value less
    4 KiB) of a repeated pattern. Random bytes that size would be over the broker's limit once lz4 has framed them
    (it grows what it cannot shrink): the broker would refuse them before any agent saw them."""
    if kind == "huge":
        return "key:huge", _blob(rng, room, compressible=True)
    if kind == "null":
        return "key:null", None
    if kind == "empty":
        return "key:empty", b""
    if kind == "binary":
        return "key:binary", not_utf8(rng, min(room, 1024))
    n = rng.randint(min(room, 1024), max(1, min(room, SMALL)))
    return "key:big", _blob(rng, n, compressible=rng.random() < 0.5)


def hostile_headers(rng: random.Random, kind: str, room: int, big: bool = True) -> tuple[str, Headers | None]:
    """(label, headers) within `room` bytes: none, many (1,000-5,000 small ones, one name or many), huge values
    (1-64 KiB, one in eight up to ~1 MB; never over 64 KiB with `big` False), non-UTF-8 values, or duplicated
    names (the DLQ's own among them: a dead letter must not take the record's word for its reason)."""
    out: Headers
    if kind == "many":
        n, same = rng.randint(1000, 5000), rng.random() < 0.5
        value = rng.choice([None, b"", b"v", b"\xff\xfe"])
        out = [("h" if same else f"h{i}", value) for i in range(n)]
    elif kind == "huge":
        rare = big and rng.random() < 1 / 8
        out = [(rng.choice(HEADER_NAMES), _blob(rng, rng.randint(SMALL, BIG) if rare else rng.randint(1024, SMALL),
                                                 compressible=rng.random() < 0.5))
               for _ in range(rng.randint(1, 2 if rare else 3))]
    elif kind == "binary":
        out = [(rng.choice(HEADER_NAMES), not_utf8(rng)) for _ in range(rng.randint(1, 8))]
    elif kind == "dup":
        out = [(name, rng.choice([None, rng.randbytes(rng.randint(0, 16)), not_utf8(rng)]))
               for name in rng.sample(HEADER_NAMES, rng.randint(1, 3)) for _ in range(rng.randint(2, 10))]
    else:
        return "headers:none", None
    out = _cap(out, room)
    return (f"headers:{kind}", out) if out else ("headers:none", None)


def _cap(headers: Headers, room: int) -> Headers:
    """The first of `headers` whose bytes (names, values and framing) stay within `room`."""
    out: Headers = []
    left = room
    for name, value in headers:
        size = record_parts(None, None, [(name, value)])["headers"]
        if size > left:
            break
        out.append((name, value))
        left -= size
    return out


@st.composite
def envelopes(draw: st.DrawFn, room: int, huge: bool = False, big: bool = True) -> Envelope:
    """A hostile key and headers whose bytes stay within `room` (the record limit less the value less 4 KiB).

    `huge`: the key fills `room` (near the record limit: a few records per run, each costs megabytes).
    `big` False: a null, empty or short non-UTF-8 key and no header value over 64 KiB (valid requests, which must
    still be answered).
    """
    kind = "huge" if huge else draw(_KEY_KINDS if big else _VALID_KEY_KINDS)
    hkind = draw(_HEADER_KINDS)
    rng = random.Random(draw(_SEEDS))
    klabel, key = hostile_key(rng, kind, room if big or huge else 256)
    hlabel, headers = hostile_headers(rng, hkind, room - len(key or b""), big=big and not huge)
    return Envelope(key, headers, f"{klabel}+{hlabel}")

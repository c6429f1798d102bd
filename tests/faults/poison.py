"""Malformed requests, generated with hypothesis: every one must end on the DLQ with a reason.

Each strategy yields `(category, raw bytes or None)`. Nothing here is schema-valid: JSON-shaped cases are
checked against schemas/request.v1.json, and the image cases are valid JSON whose image bytes are not a
decodable image within limits (ingest checks magic bytes and size; the multimodal worker decodes).
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from hypothesis import strategies as st

from pipeline.contracts import MAX_IMAGE_BYTES, MAX_TEXT_CHARS

Poison = tuple[str, bytes | None]
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "request.v1.json"
# Which stage must catch a category: everything at ingest except images only a decoder can judge.
WORKER_CATEGORIES = frozenset({"image_bomb", "corrupt_image"})


def dumps(value: Any) -> bytes:
    """Compact JSON bytes; the stdlib encoder, since hypothesis draws integers beyond 64 bits."""
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


POISON = st.one_of(garbage(), truncated(), wrong_types(), explicit_nulls(), unknown_fields(), missing_required(),
                   not_objects(), huge_texts(), bad_base64(), wrong_magic(), wrong_encodings(), null_bytes(),
                   deep_nesting(), tombstones(), image_bombs(), corrupt_images())


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


def is_poison(category: str, raw: bytes | None) -> bool:
    """The generator's own check: a JSON-level case must be schema-invalid. Images are judged by decoders, and
    `meta` deeper than 8 levels by the contract (pipeline.contracts.MAX_META_DEPTH), not the schema."""
    if category in WORKER_CATEGORIES and raw is not None:
        return _undecodable(raw)
    if raw is None or category in BY_CONSTRUCTION:
        return True
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return True
    return schema_invalid(doc)

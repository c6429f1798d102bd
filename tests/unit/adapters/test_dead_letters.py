"""Dead letters that always fit, reasons that tell the truth, numbers every reader keeps, and poison detection."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from confluent_kafka import KafkaException, Producer

from pipeline.adapters.dlq import ERROR_HEADERS, error_headers, fit
from pipeline.adapters.kafka import CRASH_MARK, RECORD_OVERHEAD, oversize_reason, produce, producer_limit, record_parts
from pipeline.contracts.models import decode_request
from pipeline.contracts.records import MAX_TS, fast_request
from pipeline.errors import InvalidMessage
from pipeline.ops.up import crash_at, poison_note

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "schemas" / "request.v1.json").read_text())
LIMIT = 100_000


def size(value: bytes, key: bytes | None, headers: list[tuple[str, bytes | None]]) -> int:
    return sum(record_parts(value, key, headers).values()) + RECORD_OVERHEAD


def own() -> list[tuple[str, bytes | None]]:
    return list(error_headers("schema", "not JSON", "ingest", "t.requests", 0, 7))


def truncated(headers: list[tuple[str, bytes | None]]) -> str:
    return next((v or b"").decode() for k, v in headers if k == "x-truncated")


def test_a_record_that_fits_is_left_alone() -> None:
    h = own()
    assert fit(b"v" * 100, b"k", h, LIMIT, keep=len(ERROR_HEADERS)) == (b"v" * 100, b"k", h)


@pytest.mark.parametrize(("value", "key", "extra", "cut"), [
    (b"v" * 300_000, b"k", [], "value=300000"),
    (b"{", b"k" * 300_000, [], "key=300000"),  # the invalid-request-with-a-huge-key case
    (b"{", b"k", [("trace", b"t" * 300_000)], "header:trace=300000"),
    (b"{", b"k", [(f"h{i}", b"") for i in range(20_000)], "headers=20000 dropped"),
    (b"v" * 300_000, b"k" * 300_000, [("trace", b"t" * 300_000)], "value=300000,key=300000,header:trace=300000"),
])
def test_whatever_is_too_big_is_cut_and_said(value: bytes, key: bytes, extra: list[tuple[str, bytes | None]],
                                             cut: str) -> None:
    headers = own() + extra
    out = fit(value, key, headers, LIMIT, keep=len(ERROR_HEADERS))
    assert out is not None
    v, k, h = out
    assert size(v, k, h) <= LIMIT
    assert truncated(h) == cut
    assert h[:len(ERROR_HEADERS)] == headers[:len(ERROR_HEADERS)]  # the reason and coordinates are never cut
    assert v == value[:len(v)] and (k or b"") == key[:len(k or b"")]  # prefixes of the originals


def test_error_headers_alone_too_big_cannot_fit() -> None:
    huge = [("x-error", b"e" * LIMIT)]
    assert fit(b"v", b"k", huge, LIMIT, keep=1) is None


def test_the_reason_names_the_part_that_is_too_big() -> None:
    why = oversize_reason("the record for t.tier.light", b"v" * 429, b"k" * 9_000_000, None, 8_000_000)
    assert why is not None and "its key is 9,000,000 bytes" in why and "value 429" in why
    assert oversize_reason("r", b"v" * 10, b"k", [("h", b"x")], 8_000_000) is None


def test_librdkafka_refusals_become_a_truthful_invalid_message() -> None:
    p = Producer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": producer_limit(100_000)})
    with pytest.raises(InvalidMessage) as e:
        produce(p, "t.dlq", b"{", key=b"k" * 200_000)
    assert e.value.kind == "oversize" and "its key is 200,000 bytes" in e.value.reason
    # where librdkafka draws the line, our accounting draws it no later (so a record we let through is written)
    biggest = next(n for n in range(100_000, 0, -1) if size(b"v" * n, None, []) <= producer_limit(100_000))
    try:
        p.produce("t", b"v" * biggest)
    except KafkaException as err:  # pragma: no cover - the assertion below explains
        pytest.fail(f"librdkafka refused a record our accounting lets through: {err}")
    p.purge()


@pytest.mark.parametrize("doc", [
    {"id": "a", "text": "hi", "ts": 2**64},
    {"id": "a", "text": "hi", "ts": MAX_TS + 1},
    {"id": "a", "text": "hi", "meta": {"n": 2**70}},
    {"id": "a", "text": "hi", "meta": {"deep": [{"n": -(2**64)}]}},
    {"id": "a", "text": "hi", "meta": {"f": 1e300}},
])
def test_numbers_beyond_64_bits_are_schema_errors(doc: dict[str, object]) -> None:
    raw = json.dumps(doc).encode()
    assert not jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
    assert fast_request(raw) is None
    with pytest.raises(InvalidMessage) as e:
        decode_request(raw, 1 << 20)
    assert e.value.kind == "schema"


def test_numbers_within_range_pass() -> None:
    doc = {"id": "a", "text": "hi", "ts": MAX_TS, "meta": {"n": 2**63 - 1, "f": 1.5, "xs": [1, None, "s", True]}}
    assert jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
    assert decode_request(json.dumps(doc).encode(), 1 << 20).ts == MAX_TS


def test_nan_in_meta_is_rejected() -> None:
    with pytest.raises(InvalidMessage):
        decode_request(b'{"id": "a", "text": "hi", "meta": {"x": NaN}}', 1 << 20)


def test_a_crash_loop_on_one_offset_is_called_a_poison_record() -> None:
    log = f"2026 INFO ingest: started\n2026 CRITICAL pipeline.agents.ingest: ingest: {CRASH_MARK}t.requests[2]@1041\n"
    assert crash_at(log) == "t.requests[2]@1041"
    assert crash_at("no crash here") is None
    assert poison_note(["t.requests[2]@1041"]) == ""
    three = poison_note(["x", *["t.requests[2]@1041"] * 3])
    assert "a poison record at t.requests[2]@1041: it crashed 3 times" in three
    assert poison_note(["t.requests[2]@1041", "t.requests[2]@1050"]) == ""  # moving on: not a poison record

"""One hostile record in the middle of steady traffic through `tierflow up`: no agent restarts, every valid request
is answered exactly once, the hostile record is on the DLQ with a reason that tells the truth, and `up` keeps
running. The records come from a producer allowed four times the topic's record limit, as any client may be.

The cases (found by an outside test of `tierflow up`, each of which used to crash-loop an agent and stop the
stack): an invalid request with a key near the record limit, an invalid request with huge headers, a valid
request with a huge key (its reason blamed the 429-byte value), a request whose `ts` is beyond 64 bits, and
records written straight to a tier topic: a routed record with a huge key and one with a number out of range.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Message

from pipeline.adapters.dlq import headers_dict
from pipeline.adapters.kafka import Headers, Tail, make_producer, topics_of
from pipeline.settings import Settings
from tests.faults.conftest import Reliability
from tests.faults.harness import Observer, PidWatch, Traffic, Up, trace, verify
from tests.integration.helpers import wait_ready

pytestmark = pytest.mark.integration
TIERS = ["light", "heavy", "multimodal"]


@dataclass
class Hostile:
    name: str
    topic: str  # "requests" or a tier topic
    value: bytes
    key: bytes | None
    headers: Headers | None
    kind: str  # the DLQ kind it must get
    says: tuple[str, ...]  # what its x-error (or x-truncated) must name
    offset: int = -1
    partition: int = -1


def routed(req: dict[str, object]) -> bytes:
    """A routed record (schemas/routed.v1.json) as ingest writes it."""
    return orjson.dumps({"request": req, "features": {"chars": 2, "tokens": 1, "script": "en", "lang": "en",
                                                      "has_image": False, "image_bytes": 0, "vip": False,
                                                      "question": False, "complaint": False, "urgent": False},
                         "tier": "light", "route_reason": "short", "degraded": False, "threshold_version": 1,
                         "escalate_below": 0.5, "received_ms": 1, "ingested_ms": 1, "replay": False,
                         "shadow": False})


def cases(s: Settings) -> list[Hostile]:
    near = s.max_message_bytes - 200  # under the broker's limit, over what a copy with DLQ headers can carry
    light = topics_of(s).tier("light")
    big_ts = b'{"id":"h-ts","text":"hello","ts":' + str(2**70).encode() + b"}"
    big_meta = routed({"id": "h-meta", "text": "hi"}).replace(b'"text":"hi"}', b'"text":"hi","meta":{"n":'
                                                               + str(2**80).encode() + b"}}")
    # A valid record whose key leaves its own value 300 bytes under the limit: it is written, but what tierflow
    # writes from it (a routed record of ~600 bytes, a result of ~1 KB, each with the same key) cannot be.
    valid = orjson.dumps({"id": "h-key", "text": "where is my order?"})
    rvalid = routed({"id": "h-rkey", "text": "hi"})
    kv, kr = s.max_message_bytes - 300 - len(valid), s.max_message_bytes - 300 - len(rvalid)
    return [
        Hostile("invalid request, huge key", "requests", b"not json", b"k" * near, None, "not_json",
                ("not JSON", "key=")),
        Hostile("invalid request, huge headers", "requests", b"not json", b"h-hdr", [("trace", b"t" * near)],
                "not_json", ("not JSON", "header:trace=")),
        Hostile("valid request, huge key", "requests", valid, b"K" * kv, None, "oversize",
                ("key is", f"{kv:,} bytes")),
        Hostile("ts beyond 64 bits", "requests", big_ts, b"h-ts", None, "schema", ("ts",)),
        Hostile("routed record, huge key", light, rvalid, b"R" * kr, None, "oversize", ("key is", f"{kr:,} bytes")),
        Hostile("routed record, meta beyond 64 bits", light, big_meta, b"h-meta", None, "schema", ("meta",)),
    ]


def test_hostile_records_in_steady_traffic(settings_factory: Callable[..., Settings], tmp_path: Path,
                                           reliability: Reliability) -> None:
    s = settings_factory()
    up = Up(s.model_copy(update={"data_dir": tmp_path}))
    hostile = cases(s)
    try:
        wait_ready(s, TIERS)
        dlq = Tail(s, topics_of(s).dlq, "beginning")
        with Observer(s) as obs, PidWatch(up.agents) as watch:
            traffic = Traffic(s, "steady", 3000, 200.0, mix=(("light", 0.6), ("heavy", 0.35), ("image", 0.05)))
            with traffic:
                time.sleep(traffic.duration_s / 3)
                producer = make_producer(s, **{"message.max.bytes": 4 * s.max_message_bytes})
                for h in hostile:
                    def note(err: object, msg: Message, h: Hostile = h) -> None:
                        h.offset, h.partition = msg.offset() or -1, msg.partition() or 0
                    topic = topics_of(s).requests if h.topic == "requests" else h.topic
                    producer.produce(topic, h.value, key=h.key, headers=h.headers, on_delivery=note)
                assert producer.flush(30) == 0
                traffic.wait(traffic.duration_s + 60)
            waited = obs.wait_for(traffic.sent, timeout=120, settle_s=3.0)
        found: dict[str, dict[str, str]] = {}
        deadline = time.monotonic() + 30
        while len(found) < len(hostile) and time.monotonic() < deadline:
            for m in dlq.poll(0.5):
                hd = headers_dict(m)
                for h in hostile:
                    src = topics_of(s).requests if h.topic == "requests" else h.topic
                    if hd.get("x-source-topic") == src and hd.get("x-source-offset") == str(h.offset) \
                            and hd.get("x-source-partition") == str(h.partition):
                        found[h.name] = hd
        dlq.close()
        verdict = verify(traffic.sent, obs, duplicate_bound=0)
        restarts = dict(watch.restarts)
        truthful = {h.name: h.name in found and found[h.name].get("x-error-kind") == h.kind
                    and all(w in found[h.name].get("x-error", "") + found[h.name].get("x-truncated", "")
                            for w in h.says) for h in hostile}
        reliability.record(
            fault="hostile records (huge keys and headers, numbers beyond 64 bits) in steady traffic under "
                  "`tierflow up`",
            variant="short", load=f"{verdict.sent_valid:,} valid requests at 200/s, {len(hostile)} hostile records "
                                  "at a third of the run",
            invariants={"no agent restarted": not restarts, "`tierflow up` keeps running": up.alive(),
                        "every valid request answered exactly once": not verdict.lost and verdict.duplicates == 0
                        and not verdict.unexpected,
                        "each hostile record on the DLQ with a truthful reason": all(truthful.values())},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered, "duplicates": verdict.duplicates,
                    "restarts": restarts or 0, "dead-lettered hostile": len(found), "drain s": round(waited, 1),
                    **{h.name: (found.get(h.name, {}).get("x-error", "missing")[:120]
                                + (f" [x-truncated {found[h.name]['x-truncated'][:60]}]"
                                   if "x-truncated" in found.get(h.name, {}) else "")) for h in hostile}},
            notes="Dead letters keep the original key, value and headers where they fit; what does not is cut "
                  "(x-truncated names it with its original size). A record that cannot be written anywhere is "
                  "skipped and counted (tierflow_skipped_total), never retried.",
        )
        assert up.alive(), up.output()
        assert not restarts, (restarts, up.output())
        assert verdict.held, (verdict.violations, trace(s, verdict.lost[:3]))
        assert all(truthful.values()), {h.name: found.get(h.name) for h in hostile if not truthful[h.name]}
    finally:
        up.stop()


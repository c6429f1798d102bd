"""bench/peers: the Quix Streams and faust peers do ingest's real work, as tierflow's agent does it.

Each runner (its own process, as in the benchmark) gets the same few hundred requests on fresh topics: English
and Chinese, short and long, VIP users, and two invalid records; thresholds (a length threshold of 40) and the VIP
set are in Redis for the run. Every request must come out once, on the tier topic the rules pick, under its key,
with the envelope tierflow's agent writes (same features and route); the invalid ones on the DLQ.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from bench.peers.__main__ import quix_python, run_once
from pipeline.adapters.redis_client import make_redis
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.core.thresholds import Thresholds
from pipeline.settings import Settings

pytestmark = pytest.mark.integration

LENGTH = 40
VIPS = ("vip-1", "vip-2")
TEXTS = ["Where is my card?", "我的卡还没有收到", "How do I reset my PIN?",
         "I was charged twice for the same purchase yesterday, please refund one of them",
         "为什么我的转账被收取了手续费，而且到现在还没有到账，请尽快帮我查一下这笔钱到底去哪里了呢"]
N = 300
BAD = [b"not json", orjson.dumps({"id": "bad-2"})]  # undecodable; no text


def requests() -> list[bytes]:
    """N valid requests (every fifth from a VIP) and the invalid ones at fixed places."""
    msgs = [orjson.dumps({"id": f"r-{i}", "text": TEXTS[i % len(TEXTS)], "user_id": VIPS[i % 2] if i % 5 == 0
                          else f"u{i}", "ts": 1_700_000_000_000 + i}) for i in range(N)]
    msgs[17:17] = [BAD[0]]
    msgs[200:200] = [BAD[1]]
    return msgs


def expected_tier(req: dict[str, Any]) -> str:
    if req["user_id"] in VIPS:
        return "heavy"
    return "heavy" if len(req["text"]) > LENGTH else "light"


def prepare(s: Settings) -> None:
    store = ThresholdStore(make_redis(s), s.redis.prefix)
    store.init(Thresholds(length_threshold=LENGTH))
    store.vip_add(*VIPS)


def envelopes_checker(msgs: list[bytes], into: dict[str, dict[str, Any]]) -> Callable[[Any], None]:
    """A `check` for run_once: every request on its tier topic once, under its key; envelopes collected by id."""
    keys = {orjson.loads(m)["id"]: str(i % 5000).encode() for i, m in enumerate(msgs) if m not in BAD}

    def check(records: dict[str, list[tuple[bytes | None, bytes | None]]]) -> None:
        assert sorted(v for _, v in records["dlq"] if v in BAD) == sorted(BAD), records["dlq"]
        for tier in ("light", "heavy", "multimodal"):
            for key, value in records[tier]:
                assert value is not None
                d = orjson.loads(value)
                rid = d["request"]["id"]
                assert rid not in into, f"{rid} routed twice"
                assert d["tier"] == tier == expected_tier(d["request"]), d
                assert key == keys[rid]
                into[rid] = d
        assert sorted(into) == sorted(keys), set(keys) ^ set(into)

    return check


@pytest.fixture(scope="module")
def quix() -> str:
    try:
        return quix_python()
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"Quix's virtualenv (bench/peers/requirements-quix.txt) could not be made: {e}")


@pytest.fixture(scope="module")
def reference(services: Settings) -> dict[str, dict[str, Any]]:
    """tierflow's own agent on the same requests: its envelopes by request id."""
    msgs, out = requests(), {}
    run_once(services, "tierflow", msgs, "", check=envelopes_checker(msgs, out), prepare=prepare)
    return out


@pytest.mark.parametrize("runner", ["quix", "faust"])
def test_peer_routes_every_request_as_the_agent_does(runner: str, services: Settings, quix: str,
                                                     reference: dict[str, dict[str, Any]]) -> None:
    msgs, got = requests(), {}
    t0 = int(time.time() * 1000)
    result, split = run_once(services, runner, msgs, quix, check=envelopes_checker(msgs, got), prepare=prepare)
    t1 = int(time.time() * 1000)
    assert result["messages"] == len(msgs)
    assert sum(split.values()) == len(msgs)
    assert split["dlq"] == len(BAD)
    for rid, ref in reference.items():
        peer = got[rid]
        for field in ("request", "features", "tier", "route_reason", "degraded", "threshold_version",
                      "escalate_below", "abstain_above", "handover_above", "replay", "shadow"):
            assert peer[field] == ref[field], (rid, field, peer[field], ref[field])
        # When the record was written (this run's fill), then when the peer routed it.
        assert t0 <= peer["received_ms"] <= peer["ingested_ms"] <= t1, (rid, t0, peer, t1)
    assert {d["route_reason"] for d in got.values()} == {"short", "length", "vip"}
    assert any(d["features"]["script"] == "zh" for d in got.values())

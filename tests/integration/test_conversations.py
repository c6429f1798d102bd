"""Conversations end to end (issue 35): real broker, real Redis, the packaged e-commerce models.

Customers write in turns, each turn sent once the previous one is answered (as a person does). Many customers are
interleaved on the same partitions; each names an order of their own. A later turn's answer names that customer's
order and no one else's, says which turn it is and what of the conversation it used; `forget` leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pipeline.adapters.conversations import Conversations
from pipeline.adapters.kafka import topics_of
from pipeline.contracts.keys import Keys
from pipeline.contracts.models import validate_answer
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from schemas import validator
from tests.conftest import Running
from tests.integration.helpers import produce_all, reader
from tests.integration.test_end_to_end import start_pipeline
from workers.model import InferenceModel

pytestmark = pytest.mark.integration

CUSTOMERS = 60  # interleaved, 4 partitions: ~15 customers share each


def order_of(i: int) -> str:
    return f"{58000 + i * 7:05d}{i % 10}"  # 6 digits, distinct per customer


FIRST = {"en": "I want to cancel order {order}", "zh": "我想取消订单{order}"}
SECOND = {"en": "do I lose any money then?", "zh": "那要扣钱吗？"}
THIRD = {"en": "thanks, bye", "zh": "好的，谢谢"}


class Answers:
    """Answers by request id, read as they come."""

    def __init__(self, s: Settings) -> None:
        self.c = reader(s, topics_of(s).answers)
        self.by_id: dict[str, dict[str, Any]] = {}

    def wait(self, ids: set[str], timeout: float = 180.0) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not ids <= self.by_id.keys() and time.monotonic() < deadline:
            for m in self.c.consume(500, 0.5):
                if m.error() is None and m.value():
                    a = orjson.loads(m.value() or b"{}")
                    self.by_id[a["request_id"]] = a
        missing = ids - self.by_id.keys()
        assert not missing, f"{len(missing)} not answered, e.g. {sorted(missing)[:3]}"
        return {i: self.by_id[i] for i in ids}


def send_turn(s: Settings, turn: int, template: dict[str, str]) -> set[str]:
    reqs = []
    for i in range(CUSTOMERS):
        lang = "zh" if i % 2 else "en"
        reqs.append({"id": f"c{i}-t{turn}", "user_id": f"cust-{i}", "text": template[lang].format(order=order_of(i))})
    produce_all(s, topics_of(s).requests, [orjson.dumps(r) for r in reqs], keys=[r["user_id"] for r in reqs])
    return {r["id"] for r in reqs}


def test_interleaved_customers_keep_their_own_conversations_and_forget_erases_them(
    settings_factory: Callable[..., Settings], running: Running, packaged_models: dict[Tier, InferenceModel]
) -> None:
    s = settings_factory()
    start_pipeline(s, running, packaged_models)
    answers = Answers(s)
    first = answers.wait(send_turn(s, 1, FIRST))
    second = answers.wait(send_turn(s, 2, SECOND))
    third = answers.wait(send_turn(s, 3, THIRD))

    orders = {order_of(i) for i in range(CUSTOMERS)}
    for i in range(CUSTOMERS):
        a1, a2, a3 = first[f"c{i}-t1"], second[f"c{i}-t2"], third[f"c{i}-t3"]
        for a in (a1, a2, a3):
            validate_answer(a)
            validator("answer").validate(a)
        assert (a1["turn"], a2["turn"], a3["turn"]) == (1, 2, 3), (a1, a2, a3)
        assert a1["conversation_id"] == a2["conversation_id"] == a3["conversation_id"]
        # the second turn names the order of the first: this customer's, and no one else's
        assert order_of(i) in a2["answer"], a2
        assert not [o for o in orders - {order_of(i)} if o in a2["answer"] or o in a3["answer"]], "a leak"
        assert "slot:order_id" in a2["context_used"], a2
        # "do I lose any money then?" alone is no shop question; read with the first turn it is about the order
        assert a2["intent"] in ("cancel_order", "check_cancellation_fee"), a2
        assert a3["intent"] == "chitchat", a3  # thanks close the topic, they do not continue it

    store = Conversations(_redis(s), Keys(s.redis.prefix), s.conversation, "test")
    turns = store.turns("cust-0")
    assert [t["id"] for t in turns] == ["c0-t1", "c0-t2", "c0-t3"]
    assert all("intent" in t and "answer" in t for t in turns), turns  # each completed by the stage answering it
    assert store.forget("cust-0") >= 1
    assert store.held("cust-0") == [] and store.turns("cust-0") == []
    assert store.turns("cust-1"), "forgetting one customer leaves the others"

    # after forget, the customer's next message starts a new conversation
    produce_all(s, topics_of(s).requests, [orjson.dumps({"id": "c0-t4", "user_id": "cust-0", "text": SECOND["en"]})],
                keys=["cust-0"])
    again = answers.wait({"c0-t4"})["c0-t4"]
    assert again["turn"] == 1 and order_of(0) not in again["answer"], again


def test_a_replay_keeps_each_customers_conversation_apart_from_the_live_one(
    settings_factory: Callable[..., Settings], running: Running, packaged_models: dict[Tier, InferenceModel],
    tmp_path: Path,
) -> None:
    """A backfill of a time range replays each customer's turns in order, in a conversation of its own job (the
    live one is left as it was); a file's turns sit at their own `ts`, so an idle gap still starts a new one."""
    s = settings_factory()
    start_pipeline(s, running, packaged_models)
    answers = Answers(s)
    start_ms = int(time.time() * 1000) - 1
    answers.wait(send_turn(s, 1, FIRST))
    answers.wait(send_turn(s, 2, SECOND))
    end_ms = int(time.time() * 1000) + 1
    env = {**os.environ, **s.with_env()}
    cli = [sys.executable, "-m", "pipeline.cli", "replay", "--max-live-slowdown", "0"]
    out = subprocess.run([*cli, "--topic", topics_of(s).requests, "--from", str(start_ms), "--to", str(end_ms)],
                         env=env, check=True, capture_output=True, text=True, timeout=300)
    ids = {f"c{i}-t{t}" for i in range(CUSTOMERS) for t in (1, 2)}
    deadline = time.monotonic() + 180
    replayed: dict[str, dict[str, Any]] = {}
    while not ids <= replayed.keys() and time.monotonic() < deadline:
        for m in answers.c.consume(500, 0.5):
            if m.error() is None and m.value() and (a := orjson.loads(m.value() or b"{}"))["replay"]:
                replayed[a["request_id"]] = a
    # (the Chinese second turns escalate to heavy: the stage that answers a replayed id is the one to claim it)
    assert ids <= replayed.keys(), (sorted(ids - replayed.keys()), out.stdout, out.stderr[-2000:])
    store = Conversations(_redis(s), Keys(s.redis.prefix), s.conversation, "test")
    for i in range(CUSTOMERS):
        a1, a2 = replayed[f"c{i}-t1"], replayed[f"c{i}-t2"]
        assert (a1["turn"], a2["turn"]) == (1, 2), (a1, a2)
        assert a1["conversation_id"] == a2["conversation_id"] == answers.by_id[f"c{i}-t1"]["conversation_id"]
        assert order_of(i) in a2["answer"] and "slot:order_id" in a2["context_used"], a2
        # the live conversation holds the live turns only; the replay's is a copy of its own
        assert [t["id"] for t in store.turns(f"cust-{i}")] == [f"c{i}-t1", f"c{i}-t2"]
        assert any(":replay:" in k for k in store.held(f"cust-{i}")), store.held(f"cust-{i}")

    # A file: one customer's turns a minute apart (one conversation), another's two hours apart (two).
    t0 = int(time.time() * 1000) - 3 * 3600_000
    rows = [{"id": "near-1", "user_id": "near", "ts": t0, "text": FIRST["en"].format(order="731205")},
            {"id": "near-2", "user_id": "near", "ts": t0 + 60_000, "text": SECOND["en"]},
            {"id": "far-1", "user_id": "far", "ts": t0, "text": FIRST["en"].format(order="731206")},
            {"id": "far-2", "user_id": "far", "ts": t0 + 7200_000, "text": SECOND["en"]}]
    path = tmp_path / "backfill.jsonl"
    path.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows))
    subprocess.run([*cli, "--file", str(path)], env=env, check=True, capture_output=True, timeout=300)
    got = answers.wait({r["id"] for r in rows})
    assert (got["near-1"]["turn"], got["near-2"]["turn"]) == (1, 2) and "731205" in got["near-2"]["answer"]
    assert (got["far-1"]["turn"], got["far-2"]["turn"]) == (1, 1) and "731206" not in got["far-2"]["answer"]


def _redis(s: Settings) -> redis.Redis:
    from pipeline.adapters.redis_client import make_redis

    return make_redis(s)

"""The conversation store against a real Redis (the session's Valkey): upserts by id, bounds, forget, outages."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from pipeline.adapters.conversations import Conversations, Message, dump_turn, turn_of
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import Keys
from pipeline.contracts.topics import Tier
from pipeline.core import conversation as conv
from pipeline.settings import ConversationSection, Settings


@pytest.fixture
def store(services: Settings) -> Conversations:
    return Conversations(make_redis(services), Keys(f"t{uuid.uuid4().hex[:8]}:"), ConversationSection(max_turns=4),
                         "test")


def said(user: str, rid: str, text: str, at: int | None = None, **kw: object) -> Message:
    return Message(user, rid, at if at is not None else int(time.time() * 1000), text, "en", False, **kw)  # type: ignore[arg-type]


def test_a_batch_sees_its_own_earlier_turns_and_a_reread_message_is_one_turn(store: Conversations) -> None:
    now = int(time.time() * 1000)
    ctxs = store.contexts([said("u1", "a", "my headphones broke", now), said("u2", "b", "hi", now),
                           said("u1", "c", "order 58213", now + 1)], now + 2)
    a, b, c = ctxs
    assert a is not None and b is not None and c is not None
    assert (a["turn"], b["turn"], c["turn"]) == (1, 1, 2)
    assert c["history"][0]["text"] == "my headphones broke" and c["slots"]["order_id"] == "58213"
    assert a["conversation_id"] == c["conversation_id"] == "u1:a" != b["conversation_id"]
    again = store.contexts([said("u1", "c", "order 58213", now + 1)], now + 3)[0]  # the batch read again
    assert again is not None and again["turn"] == 2
    assert [t["id"] for t in store.turns("u1")] == ["a", "c"]


def test_completing_a_turn_replaces_it_and_the_list_stays_bounded(store: Conversations) -> None:
    now = int(time.time() * 1000)
    for i in range(10):
        store.contexts([said("u", f"r{i}", f"message {i}", now + i)], now + i)
    assert [t["id"] for t in store.turns("u")] == ["r6", "r7", "r8", "r9"]  # max_turns 4
    t = conv.new_turn("r9", "u:r0", now + 9, "message 9", "en", False)
    t.update(conv.outcome("track_order", Tier.LIGHT, "Track it in My Orders.", False))  # type: ignore[typeddict-item]
    store.complete([("u", None, t)])
    turns = store.turns("u")
    assert len(turns) == 4 and turns[-1].get("intent") == "track_order"
    assert store.r.pttl(store.keys.conversation("u")) > 0  # expires with the idle timeout


def test_forget_erases_every_copy_and_refuses_turns_in_flight(store: Conversations) -> None:
    now = int(time.time() * 1000)
    store.contexts([said("u", "r1", "cancel order 58213")], now)
    store.contexts([said("u", "r1", "cancel order 58213", replay_job="job-1")], now)
    store.contexts([said("other", "x", "hello")], now)
    assert len(store.held("u")) == 2
    assert store.forget("u") == 2
    assert store.held("u") == [] and store.turns("u") == [] and store.turns("u", "job-1") == []
    late = conv.new_turn("r1", "u:r1", now, "cancel order 58213", "en", False)
    store.complete([("u", None, late)])  # its answer arrives after the forget: not written back
    assert store.held("u") == []
    assert store.turns("other"), "the other customer is kept"
    time.sleep(0.01)
    assert store.contexts([said("u", "r2", "hello again")], int(time.time() * 1000))[0] is not None
    assert [t["id"] for t in store.turns("u")] == ["r2"]  # a message after the forget starts afresh


def test_a_user_id_with_glob_characters_forgets_only_itself(store: Conversations) -> None:
    store.contexts([said("a*", "r1", "x", replay_job="j"), said("ab", "r2", "y", replay_job="j")],
                   int(time.time() * 1000))
    store.forget("a*")
    assert store.turns("ab", "j") and not store.turns("a*", "j")


def test_redis_away_answers_without_context(services: Settings) -> None:
    gone = redis.Redis(port=1, socket_connect_timeout=0.2)
    store = Conversations(gone, Keys("t:"), ConversationSection(), "test")
    assert store.contexts([said("u", "r", "hi")], int(time.time() * 1000)) == [None]
    store.complete([("u", None, conv.new_turn("r", "u:r", 1, "hi", "en", False))])  # no raise


def test_stored_turns_are_read_tolerantly() -> None:
    t = conv.new_turn("r", "u:r", 5, "order 58213", "en", False)
    assert turn_of(dump_turn(t)) == t
    assert turn_of(b"not json") is None and turn_of(b"[1]") is None and turn_of(b'{"id": 1}') is None
    odd = turn_of(b'{"id": "r", "at": 5, "slots": []}')  # Lua's cjson writes an empty table as []
    assert odd is not None and odd["slots"] == {} and odd["text"] == ""


def test_hostile_conversations_are_bounded_and_a_forged_id_reads_no_one_elses_turns(store: Conversations) -> None:
    now = int(time.time() * 1000)
    # 10,000 turns of one customer, in batches as ingest places them: the list stays at max_turns
    for b in range(0, 10_000, 500):
        store.contexts([said("spam", f"s{i}", f"message {i}", now + i) for i in range(b, b + 500)], now + b + 500)
    assert len(store.turns("spam")) == 4
    # a 1 MB message (or slot): kept as its first characters, the customer's state stays small
    big = "order 58213 " + "x" * 1_000_000
    ctx = store.contexts([said("big", "b1", big, now), said("big", "b2", big, now + 1)], now + 2)[1]
    assert ctx is not None and ctx["slots"]["order_id"] == "58213"
    stored = store.r.lrange(store.keys.conversation("big"), 0, -1)
    assert sum(len(x) for x in stored) < 2 * conv.TEXT_CHARS * 2 + 1000, [len(x) for x in stored]
    # a forged conversation_id naming another customer's conversation: a new conversation of the sender's own
    store.contexts([said("victim", "v1", "my order 771234 to 5 Elm Street", now)], now)
    forged = store.contexts([said("mallory", "m1", "what was my address?", now + 1,
                                  conversation_id="victim:v1")], now + 2)[0]
    assert forged is not None and forged["history"] == [] and "771234" not in str(forged)
    assert [t["id"] for t in store.turns("victim")] == ["v1"]

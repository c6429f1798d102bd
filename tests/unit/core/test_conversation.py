"""The conversation rules (pipeline/core/conversation.py): which turns are the conversation, what the context says,
how ingest steers a message in it, and which reading a stage answers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.contracts.records import Turn
from pipeline.contracts.topics import Tier
from pipeline.core import conversation as conv
from pipeline.core.routing import HEALTHY, Route, TierHealth

IDLE = 30 * 60 * 1000
LIGHT = Route(Tier.LIGHT, "short")


def turn(i: int, text: str, intent: str | None = None, at: int | None = None, cid: str = "u:r0",
         **flags: Any) -> Turn:
    at = at if at is not None else 1_000 * (i + 1)
    t = conv.new_turn(f"r{i}", cid, at, text, "en", flags.pop("complaint", False))
    if intent is not None:
        t.update(conv.outcome(intent, Tier.LIGHT, f"answer {i}", flags.pop("unresolved", t["unresolved"])))  # type: ignore[typeddict-item]
    return t


def test_the_conversation_is_the_last_turns_of_one_id_each_once() -> None:
    t0, t1 = turn(0, "my headphones stopped working", "warranty_repair"), turn(1, "order 58213")
    done = {**t1, "intent": "warranty_repair"}
    assert [t["id"] for t in conv.live_turns([t1, t0, done], 5_000, IDLE)] == ["r0", "r1"]  # by time, once
    assert conv.live_turns([t0, t1], 2_000 + IDLE + 1, IDLE) == []  # silent past the idle timeout: a new one
    other = turn(2, "hi", cid="u:r2")
    assert [t["id"] for t in conv.live_turns([t0, t1, other], 5_000, IDLE)] == ["r2"]  # the last conversation
    assert [t["id"] for t in conv.live_turns([t0, t1, other], 5_000, IDLE, "u:r0")] == ["r0", "r1"]
    assert conv.live_turns([t0, t1], 5_000, IDLE, "forged") == []  # another id starts a new conversation


def test_the_context_names_the_topic_the_slots_and_the_unresolved_turns() -> None:
    past = [turn(0, "hello", "chitchat"), turn(1, "my headphones stopped working", "warranty_repair"),
            turn(2, "order 58213", "warranty_repair"),
            turn(3, "it still does not work", "warranty_repair", unresolved=True)]
    now = turn(4, "and if I lost the invoice?")
    ctx = conv.context_of(past, now)
    assert (ctx["turn"], ctx["topic"], ctx["topic_turns"], ctx["unresolved"]) == (5, "warranty_repair", 3, 1)
    assert ctx["slots"] == {"order_id": "58213", "product": "headphones"}
    assert ctx["follow_up"] and len(ctx["history"]) == conv.HISTORY_TURNS
    assert ctx["history"][-1] == {"text": "it still does not work", "lang": "en", "intent": "warranty_repair",
                                  "answer": "answer 3"}
    closed = conv.context_of([*past, turn(5, "thanks, bye", "chitchat")], now)
    assert "topic" not in closed and closed["topic_turns"] == 0  # thanks closed the topic
    pending = conv.context_of([*past, turn(5, "and the charger?")], now)
    assert pending["topic"] == "warranty_repair"  # a turn not answered yet leaves the topic standing
    first = conv.context_of([], turn(0, "and the charger?"))
    assert first["turn"] == 1 and not first["follow_up"] and "topic" not in first


def test_ingest_steers_only_unhappy_light_bound_messages() -> None:
    past = [turn(0, "my parcel is late", "track_order")]
    calm = conv.context_of(past, turn(1, "order 58213"))
    assert conv.steer(LIGHT, calm, False, HEALTHY) == conv.Steer(LIGHT)
    unhappy = conv.context_of(past, turn(1, "it still has not arrived"))
    s = conv.steer(LIGHT, unhappy, False, HEALTHY)
    assert (s.route.tier, s.route.reason, s.handover) == (Tier.HEAVY, "context:unresolved", None)
    again = conv.context_of([*past, turn(1, "it still has not arrived", "track_order")],
                            turn(2, "I already asked twice, still nothing"))
    s = conv.steer(LIGHT, again, False, HEALTHY)
    assert (s.route.tier, s.handover) == (Tier.HEAVY, "unresolved")  # the second time: a person
    down = conv.steer(LIGHT, unhappy, False, TierHealth(False, "slow"))
    assert (down.route.tier, down.route.degraded, down.route.reason) == (Tier.LIGHT, True,
                                                                       "context:unresolved:degraded_slow")
    complaints = conv.context_of([turn(0, "this is terrible", "complaint", complaint=True)],
                                 turn(1, "awful service", complaint=True))
    assert conv.steer(LIGHT, complaints, True, HEALTHY).route.tier is Tier.HEAVY  # a second complaint in a row
    heavy = Route(Tier.HEAVY, "length")
    assert conv.steer(heavy, unhappy, False, HEALTHY).route is heavy
    assert conv.steer(LIGHT, None, True, HEALTHY).route is LIGHT


@pytest.mark.parametrize(("own", "joined", "text", "want"), [
    (conv.Guess("delivery_options", 0.95), conv.Guess("track_order", 0.9), "what are the shipping options?",
     ("delivery_options", "own")),  # a confident new question stands on its own
    (conv.Guess("get_refund", 0.4), conv.Guess("check_cancellation_fee", 0.7), "do I lose any money then?",
     ("check_cancellation_fee", "joined")),  # unsure alone, read with the conversation
    (conv.Guess("chitchat", 0.8, True), conv.Guess("chitchat", 0.6, True), "sure, 48821",
     ("cancel_order", "topic")),  # a fragment that reads as small talk both ways stays on the topic
    (conv.Guess("chitchat", 0.9, True), conv.Guess("cancel_order", 0.9), "thanks, bye",
     ("chitchat", "own")),  # thanks close the topic
    (conv.Guess("get_refund", 0.5), conv.Guess("track_order", 0.3), "how long?", ("cancel_order", "topic")),
    (conv.Guess("track_order", 0.99), conv.Guess("get_refund", 0.7), "order 58213",
     ("cancel_order", "topic")),  # a slot-only reply is a follow-up however sure the classifier is of it alone
])
def test_a_stage_reads_an_unsure_message_with_its_conversation(own: conv.Guess, joined: conv.Guess, text: str,
                                                               want: tuple[str, str]) -> None:
    ctx = conv.context_of([turn(0, "I want to cancel order 58213", "cancel_order")], turn(1, text))
    r = conv.choose(ctx, own, joined, text)
    assert (r.intent, r.source) == want
    assert ("previous_turn" in r.used) == (r.source != "own")
    assert conv.choose(None, own, joined, text).source == "own"


def test_a_restated_topic_escalates_and_a_second_restatement_goes_to_a_person() -> None:
    past = [turn(0, "my parcel is late", "track_order")]
    ctx = conv.context_of(past, turn(1, "where is my parcel??"))
    assert conv.restated(ctx, "track_order") and conv.handover_due(ctx, "track_order") is None
    assert not conv.restated(ctx, "get_refund") and not conv.restated(ctx, "chitchat")
    twice = conv.context_of([*past, turn(1, "where is my parcel??", "track_order", unresolved=True)],
                            turn(2, "where is my parcel, I asked already"))
    assert conv.handover_due(twice, "track_order") == "unresolved"
    follow = conv.context_of(past, turn(1, "order 58213"))
    assert not conv.restated(follow, "track_order")  # giving the order number is not restating


def test_the_answer_names_the_order_of_the_conversation_once() -> None:
    ctx = conv.context_of([turn(0, "cancel order 58213 please", "cancel_order")], turn(1, "is there a fee?"))
    assert conv.used_slots(ctx, "en", "Free until it ships.") == ("Order 58213: ", ("slot:order_id",))
    assert conv.used_slots(ctx, "zh", "发货前免费。") == ("订单 58213：", ("slot:order_id",))
    assert conv.used_slots(ctx, "en", "Order 58213: free.") == ("", ("slot:order_id",))
    assert conv.used_slots(None, "en", "x") == ("", ())
    assert conv.used_slots(ctx, "en", "Order 58213: free.", "cancel 58213") == ("", ())  # the message's own


@given(st.text(max_size=3000), st.lists(st.text(max_size=400), max_size=30))
def test_a_turn_and_its_context_stay_bounded_whatever_the_text(text: str, earlier: list[str]) -> None:
    past = [turn(i, t, "track_order") for i, t in enumerate(earlier)]
    t = conv.new_turn("now", "u:r0", 10**9, text, "en", False)
    assert len(t["text"]) <= conv.TEXT_CHARS and all(len(v) <= 64 for v in t["slots"].values())
    ctx = conv.context_of(past, t)
    assert len(ctx["history"]) <= conv.HISTORY_TURNS
    assert all(len(h["text"]) <= conv.TEXT_CHARS and len(h.get("answer", "")) <= conv.TEXT_CHARS
               for h in ctx["history"])

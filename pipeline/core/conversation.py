"""Conversations: a customer's earlier turns folded into the context each stage uses. Pure; the store that keeps
the turns is pipeline/adapters/conversations.py.

A conversation is one customer's turns (requests with the same `user_id`) with no gap longer than the idle timeout,
or those sent with the same `conversation_id`. A turn is written when ingest routes it and completed when its
answer is sent, so the next message sees it even while its answer is still being written.

What the context decides, each decision named where it shows (`route_reason`, `context_used`, the hand-over's
reason):
- ingest: a message saying an earlier answer did not help ("still", "again", "还是") or a second complaint in a
  row goes heavy (`context:unresolved`); the second such message in a conversation goes to a person (`handover`);
- the stages: a follow-up ("order 58213", "and if I lost the invoice?") is classified with the turn that opened
  its topic; the light tier escalates a message that restates the open topic (its answer did not help), and
  the last stage hands over the second restatement;
- the answer names the order the conversation is about; the writer gets the last turns and the slots.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.contracts.records import Context, PastTurn, Turn
from pipeline.contracts.topics import Tier
from pipeline.core import slots as slot_rules
from pipeline.core.routing import Route, TierHealth

SMALL_TALK = "chitchat"
TEXT_CHARS = 280  # of a turn's text and answer kept in the store: enough to read the topic, bounded per turn
HISTORY_TURNS = 4  # earlier turns a routed record carries (the writer's prompt reads them)

# A customer saying that an earlier answer did not help. Word-bounded in English; Chinese markers as strings.
_UNRESOLVED_EN = re.compile(r"\b(still|again|already (?:asked|told|tried|did)|second time|third time|didn'?t help|"
                            r"not (?:solved|resolved|working yet)|same problem|no answer)\b", re.IGNORECASE)
# ("还是" alone also means "or", "又" alone "and also": only their complaining uses)
_UNRESOLVED_ZH = ("还是没", "还是不", "仍然", "依然", "又坏", "又出", "再次", "还没", "没解决", "没有解决", "第二次",
                  "第三次", "问过", "说过")


def unresolved_marker(text: str) -> bool:
    """The message says an earlier answer did not help."""
    t = text[:TEXT_CHARS * 4]
    return _UNRESOLVED_EN.search(t) is not None or any(m in t for m in _UNRESOLVED_ZH)


def new_turn(request_id: str, conversation_id: str, at_ms: int, text: str, lang: str, complaint: bool) -> Turn:
    """A message as the store keeps it, before its answer."""
    return {"id": request_id, "conversation_id": conversation_id, "at": at_ms, "text": text[:TEXT_CHARS],
            "lang": lang, "slots": slot_rules.extract(text, lang), "follow_up": slot_rules.is_follow_up(text, lang),
            "complaint": complaint, "unresolved": unresolved_marker(text)}


def live_turns(turns: Sequence[Turn], now_ms: int, idle_ms: int, conversation_id: str | None = None) -> list[Turn]:
    """The turns of the conversation going on at `now_ms`, oldest first, each id once (its last write wins).

    A gap over `idle_ms` since the last turn ends the conversation; a `conversation_id` other than the stored
    turns' starts a new one (a client's id never reaches another customer's turns: the store is per user).
    """
    by_id: dict[str, Turn] = {}
    for t in turns:
        by_id[t["id"]] = {**by_id[t["id"]], **t} if t["id"] in by_id else t
    out = sorted(by_id.values(), key=lambda t: t["at"])
    if not out or now_ms - out[-1]["at"] > idle_ms:
        return []
    if conversation_id is not None:
        out = [t for t in out if t["conversation_id"] == conversation_id]
    else:
        last = out[-1]["conversation_id"]
        out = [t for t in out if t["conversation_id"] == last]
    return out


def conversation_id_of(requested: str | None, past: Sequence[Turn], user_id: str, first_id: str) -> str:
    """The client's id when it sent one, else the going conversation's, else a new one named after its first
    message (`user_id:first request id`: unique, and readable in a hand-over)."""
    if requested:
        return requested
    if past:
        return past[-1]["conversation_id"]
    return f"{user_id}:{first_id}"[:160]


def context_of(past: Sequence[Turn], turn: Turn) -> Context:
    """The context of `turn` given the conversation's earlier turns (oldest first)."""
    merged: dict[str, str] = {}
    for t in (*past, turn):
        merged.update(t["slots"])
    topic, topic_turns, unresolved = None, 0, 0
    for t in reversed(past):
        intent = t.get("intent")
        if intent is None:
            continue  # not answered yet: its topic is unknown, the one before stands
        if topic is None:
            if intent == SMALL_TALK:
                break  # "thanks, bye": the topic is closed
            topic = intent
        if intent != topic:
            break
        topic_turns += 1
        unresolved += t["unresolved"]
    complaints = 0
    for t in reversed(past):
        if not t["complaint"]:
            break
        complaints += 1
    ctx: Context = {"conversation_id": turn["conversation_id"], "turn": len(past) + 1,
                    "history": [_past(t) for t in past[-HISTORY_TURNS:]], "slots": merged,
                    "follow_up": bool(past) and turn["follow_up"],
                    "unresolved_marker": bool(past) and turn["unresolved"],
                    "topic_turns": topic_turns, "unresolved": unresolved, "complaints": complaints}
    if topic is not None:
        ctx["topic"] = topic
    return ctx


def _past(t: Turn) -> PastTurn:
    p: PastTurn = {"text": t["text"], "lang": t["lang"]}
    if "intent" in t:
        p["intent"] = t["intent"]
    if "answer" in t:
        p["answer"] = t["answer"][:TEXT_CHARS]
    return p


# --------------------------------------------------------------------------- ingest
_CONTEXT_ROUTES: dict[tuple[str, bool, str], Route] = {}


@dataclass(frozen=True, slots=True)
class Steer:
    """What the conversation changes in ingest's route: the route, and why a person should answer (or None)."""

    route: Route
    handover: str | None = None


def steer(base: Route, ctx: Context | None, complaint: bool, health: TierHealth) -> Steer:
    """The route of a message in its conversation. Only a light-bound message changes: a second complaint in a
    row, or a message saying an earlier answer did not help, goes heavy; the second such message in the
    conversation goes heavy and to a person (the final stage hands over with the conversation attached)."""
    if ctx is None or base.tier is not Tier.LIGHT or base.degraded or ctx["turn"] == 1:
        return Steer(base)
    unhappy = ctx["unresolved_marker"] or (complaint and ctx["complaints"] > 0)
    if not unhappy:
        return Steer(base)
    again = ctx["unresolved"] > 0 or ctx["complaints"] > 1
    return Steer(_route("unresolved", health), "unresolved" if again else None)


def _route(why: str, health: TierHealth) -> Route:
    key = (why, health.heavy_ok, health.reason)
    r = _CONTEXT_ROUTES.get(key)
    if r is None:
        r = _CONTEXT_ROUTES[key] = (Route(Tier.HEAVY, f"context:{why}") if health.heavy_ok else
                                    Route(Tier.LIGHT, f"context:{why}:degraded_{health.reason}", degraded=True))
    return r


# --------------------------------------------------------------------------- the stages
# A stage reads a message in its conversation when its own reading is less sure than this (or is small talk that
# reads as a follow-up): bench.conversations chose it on the shop's multi-turn set (BENCHMARKS.md, "Conversations").
FOLLOW_UP_BELOW = 0.8


def joined_text(ctx: Context, text: str) -> str | None:
    """The message read with the conversation's earlier turns, oldest first (None: nothing before it)."""
    if not ctx["history"]:
        return None
    return " ".join([*(t["text"] for t in ctx["history"]), text])


@dataclass(frozen=True, slots=True)
class Guess:
    """A classifier's reading of a text: its intent, how sure, and whether it is small talk."""

    intent: str
    confidence: float
    small_talk: bool = False


@dataclass(frozen=True, slots=True)
class Reading:
    """Which reading a stage answers: the message's own, the message read with the conversation (`joined`), or the
    open topic; with what of the conversation it used (the answer's `context_used`)."""

    intent: str
    source: str  # "own", "joined" or "topic"
    used: tuple[str, ...] = ()


# Small talk that closes a topic rather than continuing it: thanks and goodbyes.
_CLOSING = re.compile(r"\b(?:thanks?|thank you|thx|cheers|bye|goodbye|see you|that'?s all|all good|perfect|great)\b|"
                      r"谢|感谢|再见|拜拜|好的|没问题|明白了|知道了", re.IGNORECASE)


def closing(text: str) -> bool:
    """The message thanks or says goodbye (small talk that ends a topic, not a follow-up)."""
    return _CLOSING.search(text[:TEXT_CHARS]) is not None


def choose(ctx: Context | None, own: Guess, joined: Guess | None, text: str = "") -> Reading:
    """The reading of a message in its conversation. A message the classifier reads confidently stands on its
    own (a new question mid-conversation) unless it reads as a follow-up ("order 58213", "and if ...?", whatever
    the classifier makes of it alone); an unsure one ("do I lose any money then?") is read with the earlier
    turns, and when that reads as small talk or less surely still, it stays on the open topic. Small talk that
    thanks or says goodbye stays small talk; other small talk mid-topic ("sure, 48821", "do I get anything back?")
    is read with the conversation too."""
    if ctx is None or joined is None:
        return Reading(own.intent, "own")
    unsure = (ctx["follow_up"] or (own.small_talk and not closing(text))
              or (not own.small_talk and own.confidence < FOLLOW_UP_BELOW))
    if not unsure:
        return Reading(own.intent, "own")
    if joined.intent != SMALL_TALK and joined.confidence >= own.confidence:
        return Reading(joined.intent, "joined", ("previous_turn",))
    topic = ctx.get("topic")  # absent while the turns before are still being answered (a replay's, a fast typist's)
    if topic is None:
        return Reading(own.intent, "own")
    return Reading(topic, "topic", ("previous_turn", "topic"))


def restated(ctx: Context | None, intent: str) -> bool:
    """The message is on the open topic again without being a follow-up: the earlier answer did not help."""
    return (ctx is not None and not ctx["follow_up"] and intent != SMALL_TALK and ctx.get("topic") == intent)


def handover_due(ctx: Context | None, intent: str) -> str | None:
    """Why the last stage should hand the message to a person in its conversation, or None: the topic restated
    after an answer already restated once (two answers did not help)."""
    if ctx is not None and restated(ctx, intent) and ctx["unresolved"] > 0:
        return "unresolved"
    return None


def used_slots(ctx: Context | None, lang: str, answer: str, message: str = "") -> tuple[str, tuple[str, ...]]:
    """The opening that names the order the conversation is about, when the answer does not already, and the
    slots used: the order named in an earlier turn ("order 58213", then "can I still cancel it?"); one the
    message names itself is the message's, not the conversation's."""
    order = ctx["slots"].get("order_id") if ctx is not None else None
    if not order or order in message:
        return "", ()
    if order in answer:
        return "", ("slot:order_id",)
    return (f"订单 {order}：" if lang.startswith("zh") else f"Order {order}: "), ("slot:order_id",)


def outcome(intent: str, tier: Tier, answer: str, restated_topic: bool) -> dict[str, object]:
    """What the answering stage adds to its turn in the store."""
    return {"intent": intent, "tier": tier.value, "answer": answer[:TEXT_CHARS], "unresolved": restated_topic}

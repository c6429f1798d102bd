"""The multi-turn evaluation set workers/domains/ecommerce/conversations.jsonl: its shape, its labels and slots, and
that its generator (workers/domains/ecommerce/conversations.py) reproduces it byte for byte."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from tests.unit.texts import folded, texts_in
from workers.domains.ecommerce.conversations import OUT, build, render

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "workers" / "domains" / "ecommerce"
SET = PACK / "conversations.jsonl"
INTENTS = set(json.loads((PACK / "policies.json").read_text(encoding="utf-8"))["intents"])
CONVERSATIONS: list[dict[str, Any]] = [
    json.loads(line) for line in SET.read_text(encoding="utf-8").splitlines() if line.strip()]
CJK = re.compile(r"[\u4e00-\u9fff]")


def _turns() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(c, t) for c in CONVERSATIONS for t in c["turns"]]


def test_the_set_loads_with_both_languages_about_equally() -> None:
    assert OUT == SET
    assert len(CONVERSATIONS) >= 150
    langs = Counter(c["lang"] for c in CONVERSATIONS)
    assert set(langs) == {"en", "zh"}
    assert abs(langs["en"] - langs["zh"]) <= 0.1 * len(CONVERSATIONS), langs
    ids = [c["id"] for c in CONVERSATIONS]
    assert len(set(ids)) == len(ids) and all(c["id"].startswith(c["lang"] + "-") for c in CONVERSATIONS)
    assert len({tuple(t["text"] for t in c["turns"]) for c in CONVERSATIONS}) == len(CONVERSATIONS)


def test_every_conversation_has_two_to_five_well_formed_turns() -> None:
    for c in CONVERSATIONS:
        assert set(c) == {"id", "lang", "turns"}, c
        assert 2 <= len(c["turns"]) <= 5, c["id"]
        assert c["turns"][0]["follow_up"] is False, c["id"]  # the first turn has nothing to follow
        for t in c["turns"]:
            assert set(t) == {"text", "intent", "slots", "follow_up"}, (c["id"], t)
            assert t["text"].strip() and isinstance(t["follow_up"], bool), (c["id"], t)
    lengths = Counter(len(c["turns"]) for c in CONVERSATIONS)
    assert lengths[2] and lengths[3] and lengths[4] + lengths[5], lengths
    # English turns hold no Chinese; a Chinese conversation opens in Chinese (a later turn may be just "58213").
    assert not [t["text"] for c, t in _turns() if c["lang"] == "en" and CJK.search(t["text"])]
    assert all(CJK.search(c["turns"][0]["text"]) for c in CONVERSATIONS if c["lang"] == "zh")


def test_every_intent_is_a_policy_of_the_shop_and_most_are_covered() -> None:
    used = {t["intent"] for _, t in _turns()}
    assert used <= INTENTS, used - INTENTS
    assert len(used) >= 25, INTENTS - used


def test_every_slot_is_written_in_its_turn() -> None:
    for c, t in _turns():
        assert set(t["slots"]) <= {"order_id", "product", "amount"}, (c["id"], t)
        for name, value in t["slots"].items():
            assert isinstance(value, str) and value and value in t["text"], (c["id"], name, t)
        if "order_id" in t["slots"]:
            assert re.fullmatch(r"\d{5,12}", t["slots"]["order_id"]), (c["id"], t)


def test_most_conversations_depend_on_their_context() -> None:
    with_follow_up = [c for c in CONVERSATIONS if any(t["follow_up"] for t in c["turns"])]
    assert len(with_follow_up) >= 0.6 * len(CONVERSATIONS)
    # An order number given in one turn and a later turn on the same order.
    later = [c for c in CONVERSATIONS
             if any("order_id" in t["slots"] for t in c["turns"][:-1])]
    assert len(later) >= 30


def test_no_turn_is_a_training_line() -> None:
    """Every file the e-commerce pack trains on (domain.json: train, out_of_scope, chitchat, multilingual)."""
    pack = json.loads((PACK / "domain.json").read_text(encoding="utf-8"))
    seen = texts_in((PACK / rel).resolve()
                    for rel in [*pack["train"], *pack["out_of_scope"], *pack["chitchat"], pack["multilingual"]])
    fold = {folded(t) for t in seen}
    assert not [t["text"] for _, t in _turns() if folded(t["text"]) in fold]


def test_the_generator_reproduces_the_committed_file() -> None:
    assert render(build()).encode("utf-8") == SET.read_bytes()

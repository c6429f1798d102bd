"""Knowing what it does not know (issue 20), end to end: a shop's mixed stream through a real broker, real Redis
and the packaged e-commerce models, with the default thresholds.

20% of the messages are questions no shop intent covers and 10% small talk (English and Chinese, from
workers/data/general/test.csv, which no model was trained on); the rest are the pack's own natural check-set
messages (half Chinese), topped up from its held-out test split. Every id is answered exactly once; unknown
questions are handed over to a person (an answer with the holding message and one record on tierflow.handover each,
with its reason); small talk is answered by the light tier.
"""

from __future__ import annotations

import csv
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from pipeline.adapters.kafka import topics_of
from pipeline.adapters.tails import HandoverReader
from pipeline.contracts.models import validate_answer, validate_handover
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from schemas import validator
from tests.conftest import Running
from tests.integration.helpers import drain, produce_all, reader, values
from tests.integration.test_end_to_end import start_pipeline
from workers.domains import CHITCHAT, load_domain
from workers.model import InferenceModel

pytestmark = pytest.mark.integration

GENERAL_TEST = Path(__file__).resolve().parents[2] / "workers" / "data" / "general" / "test.csv"
N = 200


def mixed_stream(seed: int = 0) -> list[dict[str, str]]:
    """N requests: 70% in scope, 20% unknown, 10% chit-chat, shuffled; each id says which it is."""
    rng = random.Random(seed)
    with GENERAL_TEST.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    unknown = rng.sample([r["text"] for r in rows if r["category"] == "oos"], N * 20 // 100)
    chat = rng.sample([r["text"] for r in rows if r["category"] == CHITCHAT], N * 10 // 100)
    shop = load_domain("ecommerce")
    assert shop.check is not None and shop.test is not None
    known = [json.loads(line)["text"] for line in shop.check.read_text(encoding="utf-8").splitlines() if line.strip()]
    with shop.test.open(newline="", encoding="utf-8") as f:
        held_out = [r["text"] for r in csv.DictReader(f)]
    want = N - len(unknown) - len(chat)
    in_scope = rng.sample(known, min(len(known), want))
    in_scope += rng.sample(held_out, want - len(in_scope))
    reqs = [{"id": f"{kind}-{i}", "text": text} for kind, texts in (("in", in_scope), ("unknown", unknown),
                                                                       ("chat", chat)) for i, text in enumerate(texts)]
    rng.shuffle(reqs)
    return reqs


def test_unknown_questions_are_handed_over_and_small_talk_answered_by_light(
    settings_factory: Callable[..., Settings], running: Running, packaged_models: dict[Tier, InferenceModel]
) -> None:
    s = settings_factory()
    t = topics_of(s)
    start_pipeline(s, running, packaged_models)
    reqs = mixed_stream()
    answers_c, handover_c = reader(s, t.answers), reader(s, t.handover)
    produce_all(s, t.requests, [orjson.dumps(r) for r in reqs])

    answers = values(drain(answers_c, lambda ms: len(ms) >= N, timeout=240, settle=2.0))
    ids = Counter(a["request_id"] for a in answers)
    assert set(ids) == {r["id"] for r in reqs} and max(ids.values()) == 1, "every id answered exactly once"
    for a in answers:
        validate_answer(a)
        validator("answer").validate(a)
    by_kind: dict[str, list[dict[str, object]]] = {}
    for a in answers:
        by_kind.setdefault(str(a["request_id"]).split("-")[0], []).append(a)

    handed = [a for a in answers if a.get("handover")]
    records = values(drain(handover_c, lambda ms: len(ms) >= len(handed), timeout=60, settle=2.0))
    for c in (answers_c, handover_c):
        c.close()

    unknown, chat, known = by_kind["unknown"], by_kind["chat"], by_kind["in"]
    caught = sum(1 for a in unknown if a.get("handover"))
    assert caught >= 0.8 * len(unknown), f"{caught} of {len(unknown)} unknown questions handed over"
    book = load_domain("ecommerce").answers
    for a in handed:
        assert a["handover_reason"] == "out_of_scope"
        assert a["answer"] == book.holding(str(a["lang"])), "the holding message, in the customer's language"
    # small talk: a chit-chat reply from the light tier; what the model takes for small talk is never handed over
    by_light = [a for a in chat if a["intent"] == CHITCHAT and a["tier"] == Tier.LIGHT.value and not a.get("handover")]
    assert len(by_light) >= 0.9 * len(chat), [(a["request_id"], a["intent"], a["tier"]) for a in chat]
    assert not [a for a in answers if a["tier"] == Tier.LIGHT.value and a["intent"] == CHITCHAT and a.get("handover")]
    # in scope: nearly all answered by a model
    assert sum(1 for a in known if a.get("handover")) <= 0.1 * len(known)

    # one record per hand-over on the desk's topic, with its reason, valid under the schema
    assert Counter(h["request_id"] for h in records) == Counter(a["request_id"] for a in handed)
    # what a desk reads with `tierflow handovers`: the same records, each id once
    desk = HandoverReader(s)
    seen: list[str] = []
    while not desk.caught_up:
        seen += [str(h["request_id"]) for h in desk.poll(0.5)]
    desk.close()
    assert sorted(seen) == sorted(str(h["request_id"]) for h in records)
    texts = {r["id"]: r["text"] for r in reqs}
    for h in records:
        validate_handover(h)
        validator("handover").validate(h)
        assert h["reason"] == "out_of_scope" and h["oos_score"] > h["handover_above"]
        assert h["text"] == texts[h["request_id"]]

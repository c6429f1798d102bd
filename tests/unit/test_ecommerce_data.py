"""The e-commerce domain's data: the policy knowledge base keeps its own key facts, and the bilingual check set
covers every intent in both languages (workers/domains/ecommerce/README.md)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from tests.unit.texts import folded, texts_in

ROOT = Path(__file__).resolve().parents[2]
POLICIES = json.loads((ROOT / "workers" / "domains" / "ecommerce" / "policies.json").read_text(encoding="utf-8"))
CHECK = [json.loads(line) for line in (ROOT / "workers" / "domains" / "ecommerce" / "check.jsonl").read_text(
    encoding="utf-8").splitlines() if line.strip()]
CJK = re.compile(r"[\u4e00-\u9fff]")
# The shop's policies: every intent but small talk, whose short replies state no policy and have no facts to keep.
SHOP = {k: v for k, v in POLICIES["intents"].items() if k != "chitchat"}


def test_every_policy_states_its_key_facts_in_both_languages() -> None:
    policies = SHOP
    assert len(policies) == 29 and {"product_price", "warranty_repair"} <= set(policies)
    assert "chitchat" in POLICIES["intents"]
    for intent, p in policies.items():
        assert p["facts"], intent
        for lang in ("en", "zh"):
            assert p[lang].strip(), (intent, lang)
            for fact in p["facts"]:
                assert any(alt in p[lang] for alt in fact[lang]), (intent, lang, fact[lang])
        assert CJK.search(p["zh"]) and not CJK.search(p["en"]), intent


def test_the_check_set_covers_every_intent_in_both_languages() -> None:
    intents = set(SHOP)
    assert len(CHECK) >= 100
    langs = Counter(r["lang"] for r in CHECK)
    assert langs["zh"] >= len(CHECK) / 2 - 1, langs
    per = Counter((r["intent"], r["lang"]) for r in CHECK)
    assert all(per[(i, lang)] >= 2 for i in intents for lang in ("en", "zh")), per
    for r in CHECK:
        assert r["intent"] in intents and set(r.get("also", [])) <= intents - {r["intent"]}, r
        assert bool(CJK.search(r["text"])) == (r["lang"] == "zh"), r
    assert len({r["text"] for r in CHECK}) == len(CHECK)
    multi = [r for r in CHECK if r.get("also")]
    assert len(multi) >= 10 and any("发票找不到了" in r["text"] for r in multi)


def test_no_training_line_is_in_the_check_set() -> None:
    import csv

    data = ROOT / "workers" / "data"
    train = {json.loads(line)["text"] for line in (data / "ecommerce" / "train_zh.jsonl").read_text(
        encoding="utf-8").splitlines() if line.strip()}
    for path in (data / "ecommerce" / "train_en_extra.csv", data / "bitext" / "train.csv",
                 data / "bitext" / "test.csv"):
        with path.open(newline="", encoding="utf-8") as f:
            train |= {row["text"] for row in csv.DictReader(f)}
    fold = {t.strip().casefold() for t in train}
    assert not [r["text"] for r in CHECK if r["text"].strip().casefold() in fold]
    zh = Counter(json.loads(line)["category"] for line in (data / "ecommerce" / "train_zh.jsonl").read_text(
        encoding="utf-8").splitlines() if line.strip())
    assert set(zh) == set(SHOP) and min(zh.values()) >= 6


def test_the_general_test_lines_were_never_trained_on() -> None:
    """workers/data/general/test.csv (bench.out_of_scope's off-topic and small-talk tests) shares no line with any
    training file of either pack."""
    import csv

    data = ROOT / "workers" / "data"
    seen = texts_in(p for p in [*data.glob("*/*.csv"), *data.glob("*/*.jsonl")]
                    if not (p.name == "test.csv" and p.parent.name == "general"))
    fold = {folded(t) for t in seen}
    with (data / "general" / "test.csv").open(newline="", encoding="utf-8") as f:
        test = [row for row in csv.DictReader(f)]
    assert len(test) >= 300 and {r["category"] for r in test} == {"chitchat", "oos"}
    assert not [r["text"] for r in test if folded(r["text"]) in fold]

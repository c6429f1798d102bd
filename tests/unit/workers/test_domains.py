"""Domain packs: the built-in e-commerce and banking packs, a user's own pack without code, and the artefacts that
go with each (a worker refuses another domain's)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.domains import AnswerBook, about_order, load_domain, order_id
from workers.model import Item
from workers.models.charngram import CharNgramClassifier
from workers.models.common import domain_artifacts
from workers.models.prompts import Fact
from workers.training.config import TrainConfig
from workers.training.run import main as train_main
from workers.training.run import train

CJK = re.compile(r"[\u4e00-\u9fff]")


def test_the_built_in_packs_load_with_their_answers_and_facts() -> None:
    shop, bank = load_domain("ecommerce"), load_domain("banking")
    assert shop.name == "ecommerce" and bank.name == "banking"
    assert {"warranty_repair", "product_price", "track_order"} <= shop.answers.known()
    assert len(bank.answers.known()) == 78  # BANKING77 and chit-chat
    assert "1-year" in shop.answers.answer("warranty_repair", "en")
    assert CJK.search(shop.answers.answer("warranty_repair", "zh-CN"))
    facts = shop.answers.facts("warranty_repair", "zh")
    assert Fact(("付费维修",)) in facts and all(CJK.search(f.spellings[0]) for f in facts)
    assert Fact(("一年", "1年", "12个月"), ("保修", "质保")) in facts  # "1-year" is about the warranty
    assert "online shop" in shop.business_of("en") and CJK.search(shop.business_of("zh"))
    assert shop.check is not None and shop.test is not None and len(shop.train) == 2
    assert shop.builtin and (shop.artifacts / "LATEST").is_file()


@pytest.mark.parametrize("fact", [{"en": ["24 hours"]}, {"en": [], "zh": ["24小时"]},
                                  {"en": ["24 hours"], "zh": ["24小时"], "near": ["track"]},
                                  {"en": ["24 hours"], "zh": ["24小时"], "near": {"en": "track"}}])
def test_a_malformed_key_fact_is_one_line_naming_what_is_expected(tmp_path: Path, fact: dict[str, Any]) -> None:
    book = {"fallback": {"en": "Later.", "zh": "稍后。"},
            "intents": {"track_order": {"en": "Track it.", "zh": "查询物流。", "facts": [fact]}}}
    (tmp_path / "answers.json").write_text(json.dumps(book), encoding="utf-8")
    with pytest.raises(ValueError) as e:
        AnswerBook.read(tmp_path / "answers.json")
    msg = str(e.value)
    assert "\n" not in msg and "'track_order' fact 0" in msg and '"near"?' in msg, msg


@pytest.mark.parametrize("spec", ["no-such-pack", "/nonexistent/dir"])
def test_an_unknown_pack_is_one_line_naming_what_is_expected(spec: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_domain(spec)
    msg = str(e.value)
    assert "\n" not in msg and spec in msg and "domain.json" in msg and "ecommerce" in msg


def _pack(root: Path, answers: dict[str, object] | None = None) -> Path:
    """A user's shop: two intents, twenty lines each, answers in both languages."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [(f"where is my parcel number {i}", "track_parcel") for i in range(20)]
    rows += [(f"the socks I got are the wrong size {i}", "wrong_size") for i in range(20)]
    with (root / "train.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows(rows)
    book = answers if answers is not None else {
        "fallback": {"en": "We will get back to you.", "zh": "我们会尽快回复您。"},
        "intents": {"track_parcel": {"en": "Parcels arrive in 2 days.", "zh": "包裹2天内送达。",
                                     "facts": [{"en": ["2 days"], "zh": ["2天"]}]},
                    "wrong_size": {"en": "Swap the size free within 60 days.", "zh": "60天内免费换码。"}}}
    (root / "answers.json").write_text(json.dumps(book, ensure_ascii=False), encoding="utf-8")
    (root / "domain.json").write_text(json.dumps({"name": "sockshop", "answers": "answers.json",
                                                  "train": "train.csv", "business": {"en": "a sock shop"}}))
    return root


def test_a_users_pack_trains_and_serves_without_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pack = _pack(tmp_path / "sockshop")
    assert train_main(["--domain", str(pack), "--models", "charngram"]) == 0
    assert f"serve it with TIERFLOW_DOMAIN={pack}" in capsys.readouterr().out
    version, _ = domain_artifacts(Settings(domain=str(pack)))
    assert version.path.parent == pack / "artifacts" and version.manifest["domain"] == "sockshop"
    model = CharNgramClassifier.from_settings(Settings(domain=str(pack)), Tier.LIGHT)
    model.setup("cpu")
    preds = model.predict([Item("where is my parcel number 7"), Item("the socks are the wrong size 3", "zh")])
    assert [p.intent for p in preds] == ["track_parcel", "wrong_size"]
    assert preds[0].answer == "Parcels arrive in 2 days." and preds[1].answer == "60天内免费换码。"


def test_artefacts_of_another_domain_are_refused_in_one_line(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "sockshop")
    banking = load_domain("banking").artifacts
    with pytest.raises(ConfigError) as e:
        domain_artifacts(Settings(domain=str(pack), artifacts_dir=banking))
    assert "\n" not in str(e.value) and "'banking'" in str(e.value) and "'sockshop'" in str(e.value)
    with pytest.raises(ConfigError):
        CharNgramClassifier.from_settings(Settings(domain="ecommerce", artifacts_dir=banking), Tier.LIGHT)


@pytest.mark.parametrize(("book", "wrong"), [
    ({"fallback": {"en": "x", "zh": "y"}, "intents": {"a": {"en": "only English"}}}, "'zh'"),
    ({"intents": {}}, "fallback"),
])
def test_a_broken_pack_is_one_line(tmp_path: Path, book: dict[str, object], wrong: str) -> None:
    pack = _pack(tmp_path / "broken", answers=book)
    with pytest.raises(ConfigError) as e:
        load_domain(pack)
    assert "\n" not in str(e.value) and wrong in str(e.value)


def test_training_a_built_in_pack_uses_its_data_and_writes_its_name(tmp_path: Path) -> None:
    report = train(None, tmp_path, None, TrainConfig(models=("charngram",), char_l2_grid=(1e-5,)),
                   load_domain("ecommerce"))
    manifest = json.loads((report.path / "manifest.json").read_text())
    # its 29 intents, chit-chat and the out-of-scope class
    assert manifest["domain"] == "ecommerce" and len(manifest["labels"]) == 31
    assert {"chitchat", "oos"} <= set(manifest["labels"])
    assert manifest["data"]["train_csv"] == "train.csv+train_en_extra.csv+oos_en.csv+chitchat_en.csv"
    assert report.n_test == 902
    # every data directory's licence travels with the weights (Bitext's CDLA-Sharing among them)
    assert "Community Data License Agreement – Sharing" in (report.path / "DATA-bitext-LICENSE").read_text()
    assert report.accuracies["charngram"] > 0.95


@pytest.mark.parametrize(("text", "oid"), [
    ("where is order #58213?", "58213"), ("我的订单号：58213到哪了", "58213"),
    ("cancel purchase 732201349959", "732201349959"), ("Order No. ORD-20261130-77", "ORD-20261130-77"),
    ("I ordered 2 items", None), ("my order 12 is late", None),
])
def test_the_order_number_a_message_gives_is_found(text: str, oid: str | None) -> None:
    assert order_id(text) == oid


def test_an_answer_names_the_order_the_message_gives() -> None:
    assert about_order("It ships tomorrow.", "where is order 58213", "en") == "Order 58213: It ships tomorrow."
    assert about_order("明天发货。", "订单58213到哪了", "zh") == "订单 58213：明天发货。"
    assert about_order("It ships tomorrow.", "where is my parcel", "en") == "It ships tomorrow."


@pytest.fixture(scope="module")
def shop_light() -> CharNgramClassifier:
    m = CharNgramClassifier.from_settings(Settings(), Tier.LIGHT)  # the default domain: e-commerce
    m.setup("cpu")
    return m


def test_the_default_light_model_is_the_shops(shop_light: CharNgramClassifier) -> None:
    preds = shop_light.predict([Item("my phone screen cracked, is it covered by the warranty?"),
                                Item("how much does this phone cost?"),
                                Item("where is my order 58213?")])
    assert [p.intent for p in preds] == ["warranty_repair", "product_price", "track_order"]
    assert "1-year" in preds[0].answer and preds[2].answer.startswith("Order 58213: ")


# What a new user types first: `tierflow up` prints the first, the README the second; both are order questions.
FRONT_DOOR = ["where is my order?", "where is my order 58213?"]


def test_the_front_door_examples_are_order_questions_to_both_tiers(shop_light: CharNgramClassifier) -> None:
    """Light answers them itself, confidently (no escalation), and heavy agrees: before the short everyday lines,
    light gave track_order 0.45 and heavy, after the escalation, place_order."""
    from workers.models.encoder import EncoderClassifier

    heavy = EncoderClassifier.from_settings(Settings(), Tier.HEAVY)
    heavy.setup("cpu")
    items = [Item(t) for t in FRONT_DOOR]
    for model in (shop_light, heavy):
        preds = model.predict(items)
        assert [p.intent for p in preds] == ["track_order"] * len(items), model.name
        assert min(p.confidence for p in preds) >= 0.5, [p.confidence for p in preds]
        assert not any(p.small_talk for p in preds)


def test_a_pack_s_out_of_scope_and_chitchat_lines_train_their_classes(tmp_path: Path) -> None:
    """Lines named under `out_of_scope` / `chitchat` are trained as `oos` / `chitchat` whatever their rows say;
    off-topic text scores high (the oos class takes its mass), and small talk scores 0 and gets its reply."""
    pack = _pack(tmp_path / "sockshop")
    (pack / "oos.csv").write_text("text,category\n" + "".join(f"what is the weather in city {i},anything\n"
                                                               for i in range(20)), encoding="utf-8")
    (pack / "chat.csv").write_text("text,category\n" + "".join(f"{w} there {i},x\n" for i in range(10)
                                                                for w in ("hello", "thanks")), encoding="utf-8")
    book = json.loads((pack / "answers.json").read_text(encoding="utf-8"))
    book["intents"]["chitchat"] = {"en": "Hello!", "zh": "您好！", "replies": {"thanks": {"en": "You're welcome!",
                                                                                        "zh": "不客气！"}}}
    (pack / "answers.json").write_text(json.dumps(book, ensure_ascii=False), encoding="utf-8")
    spec = json.loads((pack / "domain.json").read_text())
    (pack / "domain.json").write_text(json.dumps({**spec, "out_of_scope": ["oos.csv"], "chitchat": ["chat.csv"]}))
    assert train_main(["--domain", str(pack), "--models", "charngram"]) == 0
    model = CharNgramClassifier.from_settings(Settings(domain=str(pack)), Tier.LIGHT)
    model.setup("cpu")
    assert set(model.labels) == {"track_parcel", "wrong_size", "chitchat", "oos"}
    parcel, weather, thanks = model.predict([Item("where is my parcel number 3"),
                                             Item("what is the weather in city 12"), Item("thanks there 4")])
    assert parcel.intent == "track_parcel" and parcel.oos < 0.3
    assert weather.oos > 0.5 and weather.intent != "oos"  # the nearest known intent (never the class itself)
    assert (thanks.intent, thanks.oos, thanks.answer, thanks.small_talk) == ("chitchat", 0.0, "You're welcome!", True)


def test_the_out_of_scope_score_is_the_oos_class_or_max_softmax() -> None:
    import numpy as np

    from workers.models.common import scoped

    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3]], dtype=np.float32)
    with_oos = scoped(probs, ["a", "b", "oos"])
    assert with_oos.best.tolist() == [0, 1, 1]  # never the oos class itself
    # 1 - the best known intent's probability (the oos class takes off-topic text's mass)
    assert np.allclose(with_oos.oos, [0.3, 0.7, 0.5]) and np.allclose(with_oos.confidence, [0.7, 0.3, 0.5])
    without = scoped(probs, ["a", "b", "c"])
    assert np.allclose(without.oos, [0.3, 0.4, 0.5])  # max-softmax: 1 - the top probability
    chat = scoped(probs, ["chitchat", "b", "oos"])
    assert np.allclose(chat.oos, [0.0, 0.7, 0.5])  # small talk on top: never handed over
    assert chat.small_talk.tolist() == [True, False, False] and not with_oos.small_talk.any()


@pytest.mark.parametrize(("text", "lang", "reply"), [
    ("thank you so much", "en", "thanks"), ("谢谢啦", "zh", "thanks"), ("ok bye", "en", "bye"), ("拜拜", "zh", "bye"),
    ("hello there", "en", None), ("在吗", "zh", None),
])
def test_chit_chat_replies_to_what_the_message_says(text: str, lang: str, reply: str | None) -> None:
    book = load_domain("ecommerce").answers
    entry = book.intents["chitchat"]
    want = entry["replies"][reply][lang] if reply else entry[lang]
    assert book.answer("chitchat", lang, text) == want
    assert book.holding(lang) == book.fallback[lang]

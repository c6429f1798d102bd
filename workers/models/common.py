"""What the text classifiers share: finding a trained artefact version, and turning logits into predictions.

Pure numpy, so the light worker can use it without importing torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError
from workers.domains import CHITCHAT, DEFAULT, OUT_OF_SCOPE, AnswerBook, Domain, about_order, load_domain
from workers.model import Item, Prediction

if TYPE_CHECKING:
    from pipeline.settings import Settings

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
    LATEST file names, else its newest version directory. `None` means the default domain's packaged artefacts."""
    root = load_domain(DEFAULT).artifacts if root is None else Path(root)
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


def domain_artifacts(settings: Settings) -> tuple[ArtifactVersion, Domain]:
    """The artefact version a worker serves (`artifacts_dir`, else the domain pack's own) and its domain pack.

    Artefacts trained for another domain are refused: their labels would meet the wrong answers. Artefacts trained
    on a bare CSV (no `--domain`) name none and are served with this domain's answers where their labels have one.
    """
    domain = load_domain(settings.domain)
    version = resolve_artifacts(settings.artifacts_dir or domain.artifacts)
    trained_for = version.manifest.get("domain")
    if trained_for is not None and trained_for != domain.name:
        raise ConfigError(f"artefacts {version.path} were trained for domain {trained_for!r}, "
                          f"not {domain.name!r} (TIERFLOW_DOMAIN): set TIERFLOW_DOMAIN to the pack they came "
                          f"from, or train for this one with `tierflow train --domain {settings.domain}`")
    return version, domain


def softmax(logits: FloatArray, temperature: float = 1.0) -> FloatArray:
    """Row-wise softmax of `logits / temperature`, numerically stable."""
    z = logits / np.float32(temperature)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: FloatArray = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    return out


# A message's second intent ("screen cracked, and I lost the invoice"): the runner-up when the model gives it at
# least this probability. The heavy tier's writer then grounds its reply in both intents' policies.
SECOND_INTENT_MIN = 0.15


@dataclass(frozen=True, slots=True)
class Scoped:
    """A batch's probabilities read for scope: per row the best known intent (never the out-of-scope class), its
    probability, the runner-up's index and probability, the out-of-scope score, and whether it is small talk."""

    best: npt.NDArray[np.int64]
    confidence: FloatArray
    second: npt.NDArray[np.int64]
    second_p: FloatArray
    oos: FloatArray
    small_talk: npt.NDArray[np.bool_]


def scoped(probs: FloatArray, labels: Sequence[str]) -> Scoped:
    """The out-of-scope score of each row and its best known intents.

    The score is 1 - the probability of the best known intent. With an `oos` class (a pack trained with
    out-of-scope lines) that class takes the mass of off-topic text; without one the score is max-softmax, the
    baseline (a confident wrong intent scores low). Measured against the oos class's own probability and against
    1 - the top two known intents' on the choosing half of bench.out_of_scope: the best recall at the same in-scope
    accuracy (BENCHMARKS.md, "Knowing what it does not know").

    A message whose top label is chit-chat is small talk: it scores 0 (answered, never handed over).
    """
    p = np.asarray(probs, dtype=np.float32)
    k = labels.index(OUT_OF_SCOPE) if OUT_OF_SCOPE in labels else -1
    known = p.copy()
    if k >= 0:
        known[:, k] = -1.0
    order = np.argsort(-known, axis=1)
    best = order[:, 0]
    second = order[:, 1] if p.shape[1] > 1 else order[:, 0]
    rows = np.arange(len(p))
    confidence = p[rows, best]
    small_talk = p.argmax(axis=1) == labels.index(CHITCHAT) if CHITCHAT in labels else np.zeros(len(p), bool)
    oos = np.where(small_talk, 0.0, 1.0 - confidence)
    second_p = np.where(second != best, p[rows, second], 0.0).astype(np.float32)
    return Scoped(best.astype(np.int64), confidence, second.astype(np.int64), second_p,
                  np.clip(oos, 0.0, 1.0).astype(np.float32), small_talk)


def to_predictions(
    probs: FloatArray, labels: Sequence[str], batch: Sequence[Item], model: str, answers: AnswerBook
) -> list[Prediction]:
    """One Prediction per row of `probs`: the best known intent, its probability, the runner-up when likely too,
    the out-of-scope score, and the intent's answer in the item's language (naming the order the message gives)."""
    s = scoped(probs, labels)
    out = []
    for i, item in enumerate(batch):
        intent = labels[int(s.best[i])]
        conf = min(1.0, max(0.0, float(s.confidence[i])))
        also = labels[int(s.second[i])] if float(s.second_p[i]) >= SECOND_INTENT_MIN else None
        answer = about_order(answers.answer(intent, item.lang, item.text), item.text, item.lang)
        out.append(Prediction(intent=intent, confidence=conf, answer=answer, model=model, also=also,
                              oos=float(s.oos[i]), small_talk=bool(s.small_talk[i])))
    return out


class CalibratedClassifier:
    """`probabilities` and `predict` for a classifier that defines `logits`, `labels`, `temperature`, `name`."""

    name: str
    labels: list[str]
    temperature: float
    answers: AnswerBook | None = None  # the domain's; `from_settings` sets it, else the default domain's

    def logits(self, texts: Sequence[str]) -> FloatArray:
        raise NotImplementedError

    def probabilities(self, texts: Sequence[str]) -> FloatArray:
        """Calibrated class probabilities, one row per text."""
        return softmax(self.logits(texts), self.temperature)

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        if not batch:
            return []
        probs = self.probabilities([it.text for it in batch])
        return to_predictions(probs, self.labels, batch, self.name, self.answers or load_domain(DEFAULT).answers)

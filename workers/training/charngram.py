"""The light models: n-gram TF-IDF -> multinomial logistic regression, for English and for Chinese."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.core.features import script_of
from workers.models.charngram import CharNgramClassifier, ChineseCharNgramClassifier, FeatureConfig, Featurizer
from workers.models.common import FloatArray
from workers.training.config import TrainConfig
from workers.training.data import (
    Dataset,
    IntArray,
    Split,
    files_sha256,
    label_ids,
    multilingual_examples,
    stratified_folds,
)
from workers.training.fitting import accuracy, fit_softmax_regression, fit_temperature, sparse_tensor

log = logging.getLogger("tierflow.train")  # one logger for the whole run, as before the split


def fit_charngram(data: Dataset, y: IntArray, labels: Sequence[str], features: FeatureConfig,
                  l2: float) -> CharNgramClassifier:
    """One fit at a given L2 strength: the vocabulary and the weights learn from `data` alone."""
    feat = Featurizer.fit(data.texts, features)
    w, b = fit_softmax_regression(sparse_tensor(feat.transform(data.texts), feat.size), y, len(labels), l2)
    return CharNgramClassifier(feat, w, b, list(labels))


def train_charngram(split: Split, cfg: TrainConfig, ctx: dict[str, Any]) -> CharNgramClassifier:
    """Fit the light model; L2 strength and temperature chosen on the validation split."""

    def fit(data: Dataset, y: IntArray, l2: float) -> CharNgramClassifier:
        return fit_charngram(data, y, split.labels, cfg.features, l2)

    best: tuple[float, float, CharNgramClassifier] | None = None
    for l2 in cfg.char_l2_grid:
        model = fit(split.fit, split.y_fit, l2)
        acc = accuracy(model.logits(split.val.texts).argmax(1), split.y_val) if len(split.y_val) else 0.0
        log.info("charngram: l2=%g validation accuracy %.4f", l2, acc)
        if best is None or acc > best[0]:
            best = (acc, l2, model)
    assert best is not None
    val_acc, l2, model = best
    ctx["charngram_val_accuracy"], ctx["charngram_l2"] = val_acc, l2  # before the refit: on data it did not fit
    val_logits = model.logits(split.val.texts)
    ctx["charngram_val_logits"] = val_logits  # the heavy model's fusion weight is picked on these
    temperature = fit_temperature(val_logits, split.y_val)
    if cfg.refit:
        model = fit(split.train, split.y_train, l2)
    model.temperature = temperature
    log.info("charngram: l2=%g temperature %.3f, %d features", l2, temperature, model.featurizer.size)
    return model


# --------------------------------------------------------------------------- Chinese
def chinese_lines(labels: Sequence[str], cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """(customer lines, answer templates) in Chinese with one of `labels`: the pack's Chinese JSONL and its Chinese
    out-of-scope and small-talk lines; the answer book's Chinese texts."""
    translated, answers = multilingual_examples(labels, cfg)

    def chinese(d: Dataset) -> Dataset:
        return d.subset([i for i, t in enumerate(d.texts) if script_of(t) == "zh"])  # as the tiers route

    return chinese(translated), chinese(answers)


def balanced_weights(y: IntArray, n_classes: int) -> FloatArray:
    """Per example, 1 / its class's count (mean 1): every class weighs the same in a fit or a calibration."""
    counts = np.bincount(y, minlength=n_classes).astype(np.float32)
    w = 1.0 / counts[y]
    out: FloatArray = (w * len(y) / w.sum()).astype(np.float32)
    return out


def balanced_accuracy(pred: IntArray, y: IntArray) -> float:
    """The mean over the classes present in `y` of the share of their examples predicted right."""
    return float(np.mean([np.mean(pred[y == c] == c) for c in np.unique(y)]))


def train_charngram_zh(split: Split, cfg: TrainConfig, ctx: dict[str, Any]) -> ChineseCharNgramClassifier | None:
    """Fit the light tier's Chinese model on the pack's Chinese lines; None when it has none for these labels.

    The lines are few per intent (6-8 in the e-commerce pack, 2 in the banking one) beside hundreds of small-talk
    and out-of-scope ones, so:
    - every class weighs the same in the fit, else the two big classes take every message the model is unsure of;
    - L2 strength and temperature come from a stratified k-fold cross-validation (a 10% validation split would
      hold one line an intent): the strength with the best mean per-class accuracy out of fold, and the
      temperature that minimises the class-balanced negative log-likelihood of the out-of-fold scores, so the
      confidence the cascade escalates on is what held-out intents earn, not what the easy classes do;
    - the answer templates only ever join the fitting folds (they are replies, not questions).
    """
    lines, answers = chinese_lines(split.labels, cfg)
    if not lines.texts:
        log.info("charngram_zh: no Chinese lines with these labels; no Chinese light model")
        return None
    index = {lab: i for i, lab in enumerate(split.labels)}
    n_classes = len(split.labels)
    y, y_answers = label_ids(lines.labels, index), label_ids(answers.labels, index)
    folds = stratified_folds(y, cfg.zh_folds, cfg.seed + 3)

    def fit(keep: IntArray, l2: float) -> ChineseCharNgramClassifier:
        data = Dataset([lines.texts[i] for i in keep] + answers.texts, [lines.labels[i] for i in keep] + answers.labels)
        yy = np.concatenate([y[keep], y_answers])
        feat = Featurizer.fit(data.texts, cfg.zh_features)
        w, b = fit_softmax_regression(sparse_tensor(feat.transform(data.texts), feat.size), yy, n_classes, l2,
                                      weights=balanced_weights(yy, n_classes))
        return ChineseCharNgramClassifier(feat, w, b, split.labels)

    best: tuple[float, float, FloatArray] | None = None
    for l2 in cfg.zh_l2_grid:
        out_of_fold = np.zeros((len(y), n_classes), dtype=np.float32)
        for k in np.unique(folds):
            held = folds == k
            out_of_fold[held] = fit(np.flatnonzero(~held), l2).logits([t for t, h in zip(lines.texts, held,
                                                                                         strict=True) if h])
        score = balanced_accuracy(out_of_fold.argmax(1), y)
        log.info("charngram_zh: l2=%g cross-validated mean per-class accuracy %.4f", l2, score)
        if best is None or score > best[0]:
            best = (score, l2, out_of_fold)
    assert best is not None
    score, l2, out_of_fold = best
    temperature = fit_temperature(out_of_fold, y, balanced_weights(y, n_classes))
    model = fit(np.arange(len(y)), l2)
    model.temperature = temperature
    sources = [p for p in (cfg.multilingual_data, *(p for p, _ in cfg.relabelled if p.suffix == ".jsonl"))
               if p is not None and p.is_file()]
    ctx["charngram_zh_report"] = {
        "cv_folds": len(np.unique(folds)), "l2": l2,
        "cv_accuracy": round(accuracy(out_of_fold.argmax(1), y), 4), "cv_balanced_accuracy": round(score, 4),
        "data": {"files": "+".join(p.name for p in sources), "sha256": files_sha256(sources) if sources else None,
                 "n_lines": len(lines.texts), "n_answer_templates": len(answers.texts)},
    }
    log.info("charngram_zh: l2=%g temperature %.3f, %d features, %d lines + %d answer templates", l2, temperature,
             model.featurizer.size, len(lines.texts), len(answers.texts))
    return model

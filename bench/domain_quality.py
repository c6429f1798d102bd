"""Accuracy per language of a domain pack's light tier, heavy tier and the cascade between them, and what each
tier's model costs per message in each language.

    python -m bench.domain_quality [--domain ecommerce] [--write]

Sets: the pack's held-out test CSV (for e-commerce, Bitext's 20% split: English) and its bilingual check set
(written for tierflow, never trained on; English and Chinese, with multi-issue messages). Models: the pack's packaged
artefacts as the tiers run them (`tier_model`: light = char n-grams, English and Chinese ones; heavy = MiniLM fused
with the English char n-grams, and the multilingual e5 head for Chinese), on the CPU.

The cascade: the product's rule (`pipeline.core.cascade.outcome` at the default thresholds): light answers unless
its confidence is under `escalate_below` or its out-of-scope score over `abstain_above`; heavy answers the rest.
The curve gives accuracy at each heavy share (the least confident light answers escalate first). The operating
point is chosen on the test set's first half (the smallest share whose cascade accuracy there is within 0.5 points
of heavy-only) and reported on the second half, so it does not flatter.

Cost: CPU time of this process (`time.process_time`: every thread, e5's OpenMP ones included) per message, each
language's messages repeated to `COST_MESSAGES` and predicted in worker-sized batches, after one warm-up batch.
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
from pipeline.core.cascade import outcome
from pipeline.core.thresholds import Thresholds
from pipeline.settings import Settings
from workers.domains import Domain, load_domain
from workers.model import ByScript, InferenceModel, Item, Prediction, checked_predict

SHARES = (0.0, 0.05, 0.10, 0.20, 0.30, 0.50, 1.0)
WITHIN = 0.005  # operating point: cascade within this of heavy-only accuracy, on the choosing half
COST_MESSAGES = 1024  # per language and model: a few seconds of e5, enough for the light models' sub-ms costs


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


def run(model: InferenceModel, cases: Sequence[Case], batch: int) -> list[Prediction]:
    """Predictions in worker-sized batches."""
    out: list[Prediction] = []
    for i in range(0, len(cases), batch):
        out.extend(checked_predict(model, [Item(c.text, c.lang) for c in cases[i:i + batch]]))
    return out


def cost_ms(model: InferenceModel, cases: Sequence[Case], batch: int, n: int = COST_MESSAGES) -> tuple[float, float]:
    """(CPU ms, wall ms) per message: `cases` repeated to `n` messages, predicted in batches of `batch`."""
    items = [Item(c.text, c.lang) for c in (list(cases) * (n // max(1, len(cases)) + 1))[:n]]
    checked_predict(model, items[:batch])  # warm-up: caches, the first call of a runtime
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(0, n, batch):
        checked_predict(model, items[i:i + batch])
    return (time.process_time() - cpu) * 1000.0 / n, (time.perf_counter() - wall) * 1000.0 / n


def escalates(p: Prediction, t: Thresholds) -> bool:
    """Whether the light tier hands prediction `p` to heavy (the worker's rule at thresholds `t`)."""
    return outcome(Tier.LIGHT, p.confidence, t.escalate_below, oos_score=p.oos, abstain_above=t.abstain_above,
                   small_talk=p.small_talk).escalate


def cascade(s: Scored, share: float) -> float:
    """Accuracy when the `share` least confident light answers go to heavy."""
    conf = np.array([p.confidence for p in s.light])
    n_heavy = round(share * len(conf))
    escalate = np.zeros(len(conf), dtype=bool)
    escalate[np.argsort(conf, kind="stable")[:n_heavy]] = True
    return float(np.where(escalate, s.correct("heavy"), s.correct("light")).mean())


def at_thresholds(s: Scored, t: Thresholds) -> tuple[float, float]:
    """(accuracy, heavy share) of the cascade at thresholds `t`."""
    escalate = np.array([escalates(p, t) for p in s.light], dtype=bool)
    return float(np.where(escalate, s.correct("heavy"), s.correct("light")).mean()), float(escalate.mean())


def operating_point(s: Scored) -> tuple[float, float, float]:
    """(share chosen on the first half, cascade accuracy at it on the second half, heavy-only on the second half)."""
    idx = np.arange(len(s.cases))
    choose, report = s.subset(idx[0::2].tolist()), s.subset(idx[1::2].tolist())
    target = choose.correct("heavy").mean() - WITHIN
    grid = np.round(np.arange(101) / 100.0, 2)
    share = next((float(x) for x in grid if cascade(choose, float(x)) >= target), 1.0)
    return share, cascade(report, share), float(report.correct("heavy").mean())


@dataclass(frozen=True)
class Cost:
    """One language's per-message cost in each tier: model names and (CPU ms, wall ms) per batch size."""

    lang: str
    light: str
    heavy: str
    light_ms: dict[int, tuple[float, float]]
    heavy_ms: dict[int, tuple[float, float]]


def model_for(model: InferenceModel, lang: str) -> InferenceModel:
    """The model a tier runs for `lang` (the Chinese one of a `ByScript` pair for "zh")."""
    if isinstance(model, ByScript) and lang == "zh" and model.zh is not None:
        return model.zh
    return model.default if isinstance(model, ByScript) else model


def measure_costs(light: InferenceModel, heavy: InferenceModel, sets: dict[str, list[Case]], s: Settings
                  ) -> list[Cost]:
    """Per language, what each tier's model costs a message in worker-sized batches."""
    out = []
    for lang in ("en", "zh"):
        cases = [c for cases in sets.values() for c in cases if c.lang == lang]
        if cases:
            light_sizes = sorted({32, s.light.max_batch})
            out.append(Cost(lang, model_for(light, lang).name, model_for(heavy, lang).name,
                            {b: cost_ms(light, cases, b) for b in light_sizes},
                            {s.heavy.max_batch: cost_ms(heavy, cases, s.heavy.max_batch)}))
    return out


def cost_table(costs: list[Cost]) -> list[str]:
    light_sizes = sorted({b for c in costs for b in c.light_ms})
    heavy_sizes = sorted({b for c in costs for b in c.heavy_ms})
    lines = ["| language | light model | " + " | ".join(f"light, batch {b}: CPU ms (wall ms)" for b in light_sizes)
             + " | heavy model | " + " | ".join(f"heavy, batch {b}: CPU ms (wall ms)" for b in heavy_sizes)
             + " | heavy / light CPU |",
             "|---|---|" + "---:|" * len(light_sizes) + "---|" + "---:|" * len(heavy_sizes) + "---:|"]
    for c in costs:
        cells = [f"{c.light_ms[b][0]:.3f} ({c.light_ms[b][1]:.3f})" if b in c.light_ms else "-" for b in light_sizes]
        heavy = [f"{c.heavy_ms[b][0]:.2f} ({c.heavy_ms[b][1]:.2f})" if b in c.heavy_ms else "-" for b in heavy_sizes]
        ratio = c.heavy_ms[heavy_sizes[0]][0] / c.light_ms[32][0] if c.light_ms.get(32, (0.0,))[0] > 0 else 0.0
        lines.append(f"| {c.lang} | {c.light} | " + " | ".join(cells) + f" | {c.heavy} | " + " | ".join(heavy)
                     + f" | {ratio:.0f}x |")
    return lines


def report(domain: Domain, scored: dict[str, Scored], costs: list[Cost], load: tuple[float, float]) -> str:
    t = Thresholds()
    rule = f"escalate_below {t.escalate_below}, abstain_above {t.abstain_above}"
    lines = [
        f"Domain pack: `{domain.name}`. Models: its packaged artefacts as the tiers run them (light: char n-grams, "
        "for Chinese text the pack's Chinese char n-grams; heavy: MiniLM fused with the English char n-grams, for "
        "Chinese text the multilingual e5 head). The cascade is the worker's rule at the default thresholds "
        f"({rule}): light hands a message to heavy when unsure or when it looks out of scope.",
        "",
        f"What a message costs each tier, per language (messages of the sets below, repeated to {COST_MESSAGES}; CPU "
        "time of the process, every thread; load average "
        f"{load[0]:.1f} before, {load[1]:.1f} after: other work on the machine inflates wall times more than CPU "
        "times):",
        "",
        *cost_table(costs),
        "",
        "| set | messages | light | heavy | cascade at the defaults (heavy share) | cascade: CPU ms a message "
        "(light + heavy share x heavy, batch 32) | operating point: share chosen on half A | cascade on half B "
        "| heavy on half B |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_lang = {c.lang: c for c in costs}
    for name, s in scored.items():
        acc, share = at_thresholds(s, t)
        op_share, op_acc, op_heavy = operating_point(s)
        cost = by_lang.get(s.cases[0].lang) if s.cases else None
        cpu = (f"{cost.light_ms[32][0] + share * cost.heavy_ms[32][0]:.2f}"
               if cost and 32 in cost.light_ms and 32 in cost.heavy_ms else "-")
        lines.append(f"| {name} | {len(s.cases)} | {s.correct('light').mean():.2%} | {s.correct('heavy').mean():.2%} "
                     f"| {acc:.2%} ({share:.0%}) | {cpu} | {op_share:.0%} | {op_acc:.2%} | {op_heavy:.2%} |")
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
            casc = hp if escalates(lp, t) else lp
            for key, p in (("light", lp), ("heavy", hp), ("cascade", casc)):
                per[c.intent][f"{key} {c.lang}"].append(p.intent == c.intent)
        lines += ["", "Per intent on the check set (cascade at the defaults); correct / messages:", "",
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
    s = Settings(domain=args.domain, learn_hot_swap=False)  # the packaged models, no Redis to watch
    light, heavy = tier_model(s, Tier.LIGHT), tier_model(s, Tier.HEAVY)
    light.setup("cpu")
    heavy.setup("cpu")
    sets = read_sets(domain)
    scored = {name: Scored(cases, run(light, cases, s.light.max_batch), run(heavy, cases, s.heavy.max_batch))
              for name, cases in sets.items()}
    before = os.getloadavg()[0]
    costs = measure_costs(light, heavy, sets, s)
    body = report(domain, scored, costs, (before, os.getloadavg()[0]))
    print(body)
    if args.write:
        write_section(f"Accuracy per language on the {domain.name} pack", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

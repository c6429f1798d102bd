"""Conversations on the shop's multi-turn set (workers/domains/ecommerce/conversations.jsonl): intent accuracy of
each turn with its conversation against without (each message alone, as before conversations), per language, and
how often an order named in an earlier turn is named in a later turn's answer.

Runs the tiers' own models and the workers' own reading (workers.runner.item_of / in_context, the cascade's
escalation, pipeline/core/conversation.py's context) turn by turn, each conversation's turns kept as the store
keeps them; the pipeline test (tests/integration/test_conversations.py) runs the same through Kafka and Redis.

    python -m bench.conversations [--write]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import command, machine, write_section
from pipeline.contracts.records import Turn
from pipeline.contracts.topics import Tier
from pipeline.core import conversation as conv
from pipeline.core import features
from pipeline.core.cascade import outcome
from pipeline.core.thresholds import Thresholds
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import InferenceModel, Item, Prediction
from workers.runner import item_of, predict_in_context

SET = Path(__file__).resolve().parent.parent / "workers/domains/ecommerce/conversations.jsonl"
TITLE = "Conversations"


@dataclass
class Tally:
    n: int = 0
    right: int = 0

    def add(self, ok: bool) -> None:
        self.n += 1
        self.right += ok

    @property
    def pct(self) -> float:
        return 100.0 * self.right / self.n if self.n else 0.0

    def cell(self) -> str:
        return f"{self.pct:.1f}% ({self.right}/{self.n})"


@dataclass
class Scores:
    follow_up: dict[str, Tally] = field(default_factory=dict)  # "with" / "without"
    all_turns: dict[str, Tally] = field(default_factory=dict)
    carried: Tally = field(default_factory=Tally)  # an earlier order named in the answer
    misses: list[str] = field(default_factory=list)


def load(path: Path = SET) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cascade(light: InferenceModel, heavy: InferenceModel, item: Item, escalate_below: float) -> tuple[Prediction, str]:
    """The light tier's answer, or heavy's when light escalates (unsure, or the topic restated), each tier reading
    the message in its conversation as its workers do."""
    pred = predict_in_context(light, [item], BOOK)[0]
    fate = outcome(Tier.LIGHT, pred.confidence, escalate_below, small_talk=pred.small_talk,
                   restated=not pred.context_used and conv.restated(item.context, pred.intent))
    if fate.escalate:
        return predict_in_context(heavy, [item], BOOK)[0], "heavy"
    return pred, "light"


BOOK = load_domain("ecommerce").answers


def run(light: InferenceModel, heavy: InferenceModel, convs: list[dict[str, Any]], escalate_below: float,
        idle_ms: int) -> dict[str, Scores]:
    by_lang: dict[str, Scores] = {}
    for c in convs:
        lang = c["lang"]
        sc = by_lang.setdefault(lang, Scores())
        turns: list[Turn] = []
        ordered: str | None = None  # the order an earlier turn named
        t0 = 1_000_000
        for i, t in enumerate(c["turns"]):
            text, want = t["text"], t["intent"]
            rid, at = f"{c['id']}-{i}", t0 + i * 30_000
            f = features.extract_fields(text, None, False, 0, False)
            past = conv.live_turns(turns, at, idle_ms)
            turn = conv.new_turn(rid, conv.conversation_id_of(None, past, c["id"], rid), at, text, f["lang"],
                                 f["complaint"])
            ctx = conv.context_of(past, turn)
            item = item_of(text, f["lang"], None, ctx)
            pred, tier = cascade(light, heavy, item, escalate_below)
            alone, _ = cascade(light, heavy, Item(text, f["lang"]), escalate_below)
            opening, _ = conv.used_slots(ctx, f["lang"], pred.answer, text)
            answer = opening + pred.answer
            for key, got in (("with", pred.intent), ("without", alone.intent)):
                sc.all_turns.setdefault(key, Tally()).add(got == want)
                if t["follow_up"]:
                    sc.follow_up.setdefault(key, Tally()).add(got == want)
            if t["follow_up"] and pred.intent != want and len(sc.misses) < 12:
                sc.misses.append(f"{c['id']} turn {i + 1}: {text!r} -> {pred.intent} (want {want}; alone "
                                 f"{alone.intent}; {', '.join(pred.context_used) or 'own reading'})")
            if ordered and "order_id" not in t["slots"]:
                sc.carried.add(ordered in answer)
            ordered = t["slots"].get("order_id", ordered)
            turn.update(conv.outcome(pred.intent, Tier(tier), answer,  # type: ignore[typeddict-item]
                                     conv.restated(ctx, pred.intent) or ctx["unresolved_marker"]))
            turns.append(turn)
    return by_lang


def report(scores: dict[str, Scores], convs: list[dict[str, Any]], seconds: float) -> str:
    n_turns = sum(len(c["turns"]) for c in convs)
    langs = Counter(c["lang"] for c in convs)
    rows = ["| language | follow-up turns: with context | without (each message alone) | all turns: with | "
            "without | earlier order named in the answer |", "|---|---|---|---|---|---|"]
    for lang, sc in sorted(scores.items()):
        rows.append(f"| {lang} | {sc.follow_up['with'].cell()} | {sc.follow_up['without'].cell()} | "
                    f"{sc.all_turns['with'].cell()} | {sc.all_turns['without'].cell()} | {sc.carried.cell()} |")
    misses = [m for sc in scores.values() for m in sc.misses]
    return "\n".join([
        f"`{command()}` on {machine()}: {len(convs)} conversations "
        f"({', '.join(f'{v} {k}' for k, v in sorted(langs.items()))}), "
        f"{n_turns} turns, in {seconds:.0f} s. Each turn through the tiers' own models and the workers' reading "
        "(light, escalated to heavy when unsure or when the customer restates the topic), with the conversation "
        "kept as the store keeps it; \"without\": the same message alone, as tierflow answered before "
        "conversations.",
        "",
        *rows,
        "",
        "Follow-up turns read wrong with context (the first few):",
        "",
        *[f"- {m}" for m in misses],
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write the section '{TITLE}' of BENCHMARKS.md")
    args = ap.parse_args()
    from workers.models.registry import tier_model

    s = Settings().updated(heavy_generator="none")
    light, heavy = tier_model(s, Tier.LIGHT), tier_model(s, Tier.HEAVY)
    light.setup("cpu")
    heavy.setup("cpu")
    convs = load()
    t0 = time.perf_counter()
    scores = run(light, heavy, convs, Thresholds().escalate_below, s.conversation.idle_ms)
    body = report(scores, convs, time.perf_counter() - t0)
    print(body)
    if args.write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()

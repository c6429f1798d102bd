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
    later: list[Later] = field(default_factory=list)  # turns after one that named an order: for the writer


@dataclass(frozen=True)
class Later:
    """A turn that asks about an order an earlier turn named (the writer's test: does its answer use the slot)."""

    conversation: str
    said: list[str]  # the turns before it, as the customer wrote them
    item: Item
    order: str


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
                if want != "chitchat" and not any(x.conversation == c["id"] for x in sc.later):
                    sc.later.append(Later(c["id"], [x["text"] for x in c["turns"][:i]], item, ordered))
            ordered = t["slots"].get("order_id", ordered)
            turn.update(conv.outcome(pred.intent, Tier(tier), answer,  # type: ignore[typeddict-item]
                                     conv.restated(ctx, pred.intent) or ctx["unresolved_marker"]))
            turns.append(turn)
    return by_lang


@dataclass
class Written:
    """The heavy tier's writer on later turns: how many replies it wrote (not the template) and how many of those
    name the order from an earlier turn in its own words (the slot it was given), with examples."""

    asked: int = 0
    written: int = 0
    named: int = 0
    seconds: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    fallbacks: Counter[str] = field(default_factory=Counter)  # why a reply was sent as the template


def write_later(writer: InferenceModel, scores: dict[str, Scores], n: int) -> Written:
    """The writer's reply to `n` later turns, half per language (each alone: one reply at a time, as a customer
    waits for it)."""
    w = Written()
    langs = sorted(scores)
    picks = [x for k in range(n) if k // len(langs) < len(scores[langs[k % len(langs)]].later)
             for x in [scores[langs[k % len(langs)]].later[k // len(langs)]]]
    for x in picks:
        t0 = time.perf_counter()
        pred = predict_in_context(writer, [x.item], BOOK)[0]
        w.seconds.append(time.perf_counter() - t0)
        w.asked += 1
        if pred.fallback is not None:
            w.fallbacks[pred.fallback] += 1
            continue
        w.written += 1
        w.named += x.order in pred.answer
        if x.order in pred.answer and len(w.examples) < 5:
            turns = "\n".join(f"    > {t}" for t in [*x.said, x.item.message])
            w.examples.append(f"- {x.conversation} ({x.item.lang}), the customer:\n{turns}\n\n"
                              f"  the heavy tier wrote ({pred.intent}, {w.seconds[-1]:.1f} s):\n\n"
                              f"    {pred.answer.strip()}")
    return w


def report_written(w: Written, writer: str) -> list[str]:
    if not w.asked:
        return []
    secs = sorted(w.seconds)
    return [
        "",
        f"Written heavy answers that use the conversation's slots ({writer}, one reply at a time, "
        f"p50 {secs[len(secs) // 2]:.1f} s a reply): of {w.asked} later turns about an order named in an earlier "
        f"turn, {w.written} written ({w.asked - w.written} sent as the template, the writer's check said why: "
        f"{', '.join(f'{k} {v}' for k, v in w.fallbacks.most_common()) or 'none'}), **{w.named} of them "
        "name the order in the writer's own words** (the prompt carries the last turns and the slots; the worker's "
        "\"Order N:\" opening is not counted). Examples:",
        "",
        *w.examples,
    ]


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
    ap.add_argument("--written", type=int, default=12, help="later turns the heavy tier's writer answers (half per "
                    "language; 0: none). Each takes seconds on a CPU")
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
    if args.written:
        # The packaged writer, given the time a reply takes on this machine (a reply out of time is the template).
        ws = s.updated(heavy_generator="auto", generator_timeout_s=120.0)
        writer = tier_model(ws, Tier.HEAVY)
        writer.setup("cpu")
        body += "\n" + "\n".join(report_written(write_later(writer, scores, args.written), writer.name))
    print(body)
    if args.write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()

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
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

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


# --------------------------------------------------------------------------- what conversations cost
@dataclass
class Cost:
    """One steady run of `tierflow up` with customers' ids: the light path's own timings, and the state kept."""

    enabled: bool
    answered: int = 0
    light_total_ms: list[float] = field(default_factory=list)  # light answers not escalated: `timings_ms.total`
    light_ingest_ms: list[float] = field(default_factory=list)
    heavy_share: float = 0.0
    customers: int = 0
    bytes_each: list[int] = field(default_factory=list)  # per customer held, as stored (the turns' JSON)


def cost_run(enabled: bool, rate: float, seconds: float, customers: int) -> Cost:
    """A fresh `tierflow up` (writer off, as bench.article_service), `rate` msg/s for `seconds`: the shop pack's
    bilingual messages from `customers` customers in turn (each writes every customers/rate seconds)."""
    from bench.article_service import shop_messages
    from bench.common import run_dir, run_ids
    from bench.pipeline import send
    from pipeline.adapters.conversations import Conversations, messages_bytes
    from pipeline.adapters.kafka import make_consumer, topics_of
    from pipeline.adapters.redis_client import make_redis
    from pipeline.contracts.keys import Keys
    from pipeline.ops.devstack import free_port, running_stack, wait_agents_ready

    texts = [c.text for c in shop_messages()]
    n = int(rate * seconds)
    users = [f"cust-{i}" for i in range(customers)]
    base = Settings().updated(kafka_port=free_port(), redis_port=free_port(), heavy_generator="none",
                              conversation_enabled=enabled)
    with run_dir("conversations") as data, running_stack(base.updated(data_dir=data)) as stack:
        if wait_agents_ready(stack) is None:
            raise SystemExit(f"tierflow up did not become ready; logs in {stack.log_dir}")
        time.sleep(2)
        s = stack.settings
        ids = run_ids(n)
        answers = make_consumer(s, f"bench-{uuid.uuid4().hex[:6]}")  # from the start: a fresh stack's topic
        answers.subscribe([topics_of(s).answers])
        send(s, topics_of(s).requests, ids, rate, texts=texts, users=users)
        got: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 120
        while len(got) < n and time.monotonic() < deadline:
            for m in answers.consume(1000, 0.5):
                if m.error() is None and m.value():
                    a = orjson.loads(m.value() or b"{}")
                    got[a["request_id"]] = a
        answers.close()
        out = Cost(enabled, answered=len(got))
        for a in got.values():
            t = a["timings_ms"]
            if a["tier"] == "light" and not a["escalated"]:
                out.light_total_ms.append(float(t["total"]))
                out.light_ingest_ms.append(float(t["ingest"]))
        out.heavy_share = sum(a["tier"] == "heavy" for a in got.values()) / max(1, out.answered)
        if enabled:
            r, keys = make_redis(s), Keys(s.redis.prefix)
            store = Conversations(r, keys, s.conversation, "bench")
            held = [store.turns(u) for u in users]
            out.customers = sum(1 for h in held if h)
            out.bytes_each = [messages_bytes(h) for h in held if h]
    return out


def report_cost(runs: list[Cost], rate: float, seconds: float, customers: int, max_turns: int) -> list[str]:
    def p50(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    rows = ["| conversations | answered | light answers | light total ms: p50 | mean | light ingest ms: p50 | mean | "
            "heavy share |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in runs:
        rows.append(f"| {'on' if c.enabled else 'off'} | {c.answered} | {len(c.light_total_ms)} | "
                    f"{p50(c.light_total_ms):.1f} | {statistics.mean(c.light_total_ms or [0]):.2f} | "
                    f"{p50(c.light_ingest_ms):.1f} | {statistics.mean(c.light_ingest_ms or [0]):.2f} | "
                    f"{c.heavy_share:.1%} |")
    on = [x for c in runs if c.enabled for x in c.light_total_ms]
    off = [x for c in runs if not c.enabled for x in c.light_total_ms]
    sizes = [b for c in runs for b in c.bytes_each]
    held = max((c.customers for c in runs if c.enabled), default=0)
    return [
        "",
        f"What conversations cost (`tierflow up`, writer off; {rate:g} msg/s for {seconds:g} s a run from "
        f"{customers} customers in turn, so each writes every {customers / rate:g} s; runs alternate off/on, each on "
        "a fresh stack): the light path's own `timings_ms.total` (received to answered) of answers light gave "
        "without escalating.",
        "",
        *rows,
        "",
        f"Light path p50 with conversations {p50(on):.1f} ms against {p50(off):.1f} ms without: "
        f"**{p50(on) - p50(off):+.1f} ms** (target <= +1 ms; the answers' timings are whole milliseconds, so the "
        f"means say it finer: {statistics.mean(on or [0]) - statistics.mean(off or [0]):+.2f} ms). "
        f"State per customer held ({held} customers at the end, "
        f"at most {max_turns} turns each, expiring after the idle timeout): mean "
        f"{statistics.mean(sizes) if sizes else 0:,.0f} bytes, max {max(sizes, default=0):,} bytes of turns as "
        "stored.",
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
    ap.add_argument("--written", type=int, default=20, help="later turns the heavy tier's writer answers (half per "
                    "language; 0: none). Each takes seconds on a CPU")
    ap.add_argument("--cost", type=int, default=2, help="rounds of the cost runs (a `tierflow up` with "
                    "conversations off, then on, per round; 0: none)")
    ap.add_argument("--rate", type=float, default=50.0, help="offered load of the cost runs (msg/s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of a cost run")
    ap.add_argument("--customers", type=int, default=200, help="customers writing in the cost runs")
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
    if args.cost:
        runs = [cost_run(on, args.rate, args.seconds, args.customers) for _ in range(args.cost) for on in (False, True)]
        body += "\n" + "\n".join(report_cost(runs, args.rate, args.seconds, args.customers, s.conversation.max_turns))
    print(body)
    if args.write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()

"""A cascade that learns from its own traffic (issue 22): the light model, distilled from the heavy tier's answers
on live traffic and from labels, promoted only on evidence.

    python -m bench.learning [--quick] [--write]

1. The light model starts from 10% of BANKING77 train (stratified, seed 0): a char n-gram model, made live as a
   learned version. The heavy tier is the banking pack's MiniLM (trained on all of train): the teacher.
2. The other 90% of train streams through the embedded pipeline (ingest, a light and a heavy worker, the feedback
   agent holding a 15% heavy budget, the trainer agent) as unlabelled traffic, a fixed rate, users at random.
   Heavy's confident answers (escalations, long messages, a shadow sample of light's traffic) become examples;
   the trainer retrains and promotes what beats the live model on held-out traffic.
3. Then 10% of test arrives as labelled traffic (each request carries its `label`).
4. Every version the trainer promoted is measured offline on the rest of test (90%, never streamed): light-only
   accuracy, the cascade's accuracy at the budget (the least confident 15% answered by heavy) and the heavy share
   the cascade needs to reach 93.5%.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import redis
from confluent_kafka import Message

from bench.common import ROOT, AnswerReader, embedded_services, fresh_topics, write_section
from pipeline.adapters.heartbeats import ready_agents
from pipeline.adapters.kafka import make_producer, produce, topics_of
from pipeline.adapters.model_store import ModelStore
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.contracts.keys import Keys
from pipeline.contracts.topics import Tier
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import Item
from workers.models.charngram import CharNgramClassifier
from workers.models.common import resolve_artifacts
from workers.training.data import Dataset, read_csv, stratified_split
from workers.training.online import train_light

PNG = ROOT / "bench" / "learning.png"
DATA = ROOT / "workers" / "data" / "banking77"
TARGET = 0.935
SEED_VERSION = "seed-10pct"


@dataclass(frozen=True)
class Point:
    """One light model measured offline on the evaluation slice of test."""

    name: str
    examples: int  # examples it was trained on besides the seed
    light: float  # light-only accuracy
    cascade: float  # cascade accuracy with the budget's share answered by heavy
    share_needed: float | None  # heavy share for the target accuracy (None: not reached even all on heavy)


def cascade_curve(conf: np.ndarray, light_right: np.ndarray, heavy_right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(heavy share, cascade accuracy) when the least confident share of messages goes to heavy, every share."""
    order = np.argsort(conf, kind="stable")  # least confident first
    n = len(conf)
    gain = (heavy_right[order].astype(np.int64) - light_right[order].astype(np.int64))
    acc = (light_right.sum() + np.concatenate([[0], np.cumsum(gain)])) / n
    return np.arange(n + 1) / n, acc


def measure(name: str, examples: int, model: CharNgramClassifier, texts: list[str], truth: np.ndarray,
            heavy_right: np.ndarray, budget: float) -> Point:
    probs = model.probabilities(texts)
    light_right = probs.argmax(1) == truth
    share, acc = cascade_curve(probs.max(1), light_right, heavy_right)
    at_budget = float(acc[round(budget * len(texts))])
    reached = np.nonzero(acc >= TARGET)[0]
    return Point(name, examples, float(light_right.mean()), at_budget,
                 float(share[reached[0]]) if len(reached) else None)


class TierCounter(AnswerReader):
    """The answer reader of bench/common, also counting answers per tier."""

    def __init__(self, s: Settings, ids: list[str]) -> None:
        super().__init__(s, topics_of(s).answers, ids)
        self.order: list[str] = []  # tiers in the order the answers came
        self.wanted = set(ids)

    def take(self, m: Message, now: float) -> None:
        super().take(m, now)
        if m.error() is None and m.value():
            a = orjson.loads(m.value() or b"{}")
            if a.get("request_id") in self.wanted:
                self.order.append(a["tier"])


def send(s: Settings, rows: list[tuple[str, str]], tag: str, rate: float, labelled: bool) -> list[str]:
    p = make_producer(s)
    rnd = random.Random(tag)
    ids, t0 = [], time.monotonic()
    for i, (text, label) in enumerate(rows):
        rid = f"{tag}-{i}"
        req: dict[str, Any] = {"id": rid, "text": text, "user_id": f"user-{rnd.randrange(5000)}"}
        if labelled:
            req["label"] = label
        produce(p, topics_of(s).requests, orjson.dumps(req), rid)
        ids.append(rid)
        if i % 100 == 0:
            p.poll(0)
        ahead = (i + 1) / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    p.flush(60)
    return ids


def stream(s: Settings, rows: list[tuple[str, str]], tag: str, rate: float, labelled: bool,
           timeout: float) -> tuple[dict[str, int], float]:
    """Send `rows` and wait for every answer; answers per tier, and heavy's share of the second half of them
    (the controller has had the first half to move the thresholds)."""
    ids = [f"{tag}-{i}" for i in range(len(rows))]
    reader = TierCounter(s, ids)
    reader.start()
    try:
        send(s, rows, tag, rate, labelled)
        reader.wait(timeout)
        missing = len(ids) - len(reader.order)
        if missing > 0:
            print(f"{tag}: {missing} of {len(ids)} answers missing after {timeout:.0f} s")
        late = reader.order[len(reader.order) // 2:]
        return dict(Counter(reader.order)), late.count("heavy") / max(1, len(late))
    finally:
        reader.stop()


def backfill(s: Settings, r: redis.Redis) -> int:
    """An operator's backfill for learning: the requests topic replayed once with `--shadow` through the backfill
    lane (light and heavy run on every record, nobody is answered), so heavy answers the traffic it never saw.
    Returns the examples the trainer accepted from it, once their flow stops."""
    from pipeline.agents.replay import Replayer, TopicSource

    before = sum(trainer_state(r, s).get("verdicts", {}).values())
    source = TopicSource(name="learning-backfill", settings=s, topic=topics_of(s).requests)
    Replayer(s).run(source, job="learning-backfill", shadow=True, max_live_slowdown=None)
    offered, still = before, 0.0
    while still < 10.0:  # until the replay's results stop reaching the trainer
        time.sleep(1.0)
        now = sum(trainer_state(r, s).get("verdicts", {}).values())
        still = still + 1.0 if now == offered else 0.0
        offered = now
    return int(trainer_state(r, s).get("verdicts", {}).get("accepted", 0))


def trainer_state(r: redis.Redis, s: Settings) -> dict[str, Any]:
    raw = r.get(Keys(s.redis.prefix).learn_state)
    return json.loads(raw) if raw else {}


def settle(r: redis.Redis, s: Settings, quiet_s: float, timeout: float) -> bool:
    """Until the trainer has trained on everything it holds and nothing is in flight for `quiet_s`; False if
    `timeout` came first."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        st = trainer_state(r, s)
        idle = st and not st["training_now"] and st["new_since_training"] == 0
        if idle:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                return True
        else:
            quiet_since = None
        time.sleep(1.0)
    return False


def plot(points: list[Point], full: Point, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = list(range(len(points)))
    names = ["seed" if i == 0 else f"v{i}" for i in xs]
    ax[0].plot(xs, [p.light * 100 for p in points], "o-", label="light only")
    ax[0].plot(xs, [p.cascade * 100 for p in points], "s-", label="cascade at the budget")
    ax[0].axhline(full.light * 100, ls="--", c="gray", label="light trained on all of train")
    ax[0].set_xticks(xs, names)
    ax[0].set_ylabel("accuracy on held-out test (%)")
    ax[0].legend(fontsize=8)
    ax[1].plot(xs, [(p.share_needed or 1.0) * 100 for p in points], "o-", c="C2")
    ax[1].axhline(points[0].share_needed * 70 if points[0].share_needed else 0, ls="--", c="gray",
                  label="target: 30% below the start")
    ax[1].set_xticks(xs, names)
    ax[1].set_ylabel(f"heavy share for {TARGET:.1%} (%)")
    ax[1].legend(fontsize=8)
    fig.suptitle("The light model learning from heavy's answers (BANKING77)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="stream 2,000 messages of train instead of all 90%%")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--rate", type=float, default=100.0,
                    help="messages per second sent (100; 25 gives the feedback agent, which watches each threshold "
                         "change for a minute, six minutes to bring heavy's share to the budget)")
    ap.add_argument("--budget", type=float, default=0.15, help="the heavy budget (0.15)")
    ap.add_argument("--shadow", type=float, default=0.5,
                    help="share of light's traffic shadowed on heavy (0.5, the most the thresholds allow: more "
                         "of heavy's answers to learn from, at no cost to the answers' heavy share)")
    ap.add_argument("--retrain-every", type=int, default=300, help="new examples per retraining (300)")
    ap.add_argument("--retrain-s", type=float, default=180.0,
                    help="retrain on whatever is new this long after the last retraining (180 s; the default 600 "
                         "would only lengthen the run)")
    ap.add_argument("--per-minute", type=int, default=12_000,
                    help="the trainer's cap on examples a minute (12,000: the stream's own rate is not a flood)")
    ap.add_argument("--backfill", action=argparse.BooleanOptionalAction, default=True,
                    help="after the stream, replay it once with --shadow (heavy on every record, nobody answered)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    train, test = read_csv(DATA / "train.csv"), read_csv(DATA / "test.csv")
    stream_idx, seed_idx = stratified_split(train.labels, 0.1, args.seed)
    eval_idx, labelled_idx = stratified_split(test.labels, 0.1, args.seed)
    seed, rest = train.subset(seed_idx), train.subset(stream_idx)
    labelled, held = test.subset(labelled_idx), test.subset(eval_idx)
    rows = list(zip(rest.texts, rest.labels, strict=True))
    random.Random(args.seed).shuffle(rows)
    if args.quick:
        rows = rows[:2000]

    version = resolve_artifacts(load_domain("banking").artifacts)
    labels = version.labels
    index = {lab: i for i, lab in enumerate(labels)}
    truth = np.array([index[c] for c in held.labels])
    full_light = CharNgramClassifier.load(version.file("charngram"), labels)
    seed_weights, seed_report = train_light(seed, Dataset([], []), labels, args.seed)
    work = Path(tempfile.mkdtemp(prefix="tierflow-learning-"))
    seed_csv = work / "seed.csv"
    with seed_csv.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])
        w.writerows(zip(seed.texts, seed.labels, strict=True))

    t_start = time.monotonic()
    with embedded_services() as base:
        # The agents are child processes: what this run changes reaches them as environment variables.
        env = {"TIERFLOW_ZH_MODEL": "", "TIERFLOW_LEARN_SEED_DATA": str(seed_csv),
               "TIERFLOW_LEARN_RETRAIN_EVERY": str(args.retrain_every),
               "TIERFLOW_LEARN_RETRAIN_S": str(args.retrain_s),
               "TIERFLOW_LEARN_PER_MINUTE": str(args.per_minute)}
        s = fresh_topics(base, backlog=True).updated(domain="banking", zh_model="")
        r = redis.Redis.from_url(s.redis.address)
        ThresholdStore(r, s.redis.prefix).update("bench", "the learning benchmark's budget",
                                                 heavy_budget=args.budget, shadow_rate=args.shadow)
        models = ModelStore(r, s.redis.prefix)
        models.put(SEED_VERSION, seed_weights, {"version": SEED_VERSION, "labels": labels, "status": "promoted",
                                                "data": {"examples": 0, "seed": "10% of BANKING77 train"}})
        models.set_live(SEED_VERSION, "promote", "bench", "the starting light model: 10% of BANKING77 train")
        stack = Stack(s)
        try:
            for name, cmd in (("ingest", ["ingest"]), ("light", ["worker", "--tier", "light"]),
                              ("heavy", ["worker", "--tier", "heavy"]), ("feedback", ["feedback"]),
                              ("trainer", ["learn"])):
                stack.start_agent(name, *cmd, env=env)
            from tests.integration.helpers import wait_ready

            wait_ready(s, ["light", "heavy"], timeout=300)
            while not {"ingest", "feedback", "trainer"} <= ready_agents(r, s.redis.prefix):
                time.sleep(0.2)
            unlabelled, late_heavy = stream(s, rows, "u", args.rate, labelled=False, timeout=900)
            settle(r, s, quiet_s=5, timeout=300)
            backfilled = 0
            if args.backfill:
                backfilled = backfill(s, r)
                settle(r, s, quiet_s=5, timeout=600)
            with_labels, _ = stream(s, list(zip(labelled.texts, labelled.labels, strict=True)), "l", args.rate,
                                 labelled=True, timeout=300)
            # The last examples too: on time, then trained and judged. A retraining that cross-fits a full store
            # took 7-9 min here beside the pipeline: a run that stopped sooner reported a store it had not judged.
            settled = settle(r, s, quiet_s=5, timeout=args.retrain_s + 1800)
            state = trainer_state(r, s)
            history = models.history()
            decided = [e for e in history if e["action"] in ("promote", "reject") and e["who"] == "trainer"]
            promoted = [e for e in decided if e["action"] == "promote"]
            rollbacks = [e for e in history if e["action"] == "rollback"]
            weights = {e["version"]: models.weights(e["version"]) for e in decided}
            manifests = {e["version"]: models.manifest(e["version"]) for e in decided}
        finally:
            stack.stop()
    minutes = (time.monotonic() - t_start) / 60

    # Offline: every promoted version on the evaluation slice, the heavy model's answers computed once.
    from workers.models.registry import build

    heavy = build("minilm", Settings().updated(domain="banking", zh_model=""), Tier.HEAVY)
    heavy.setup("cpu")
    heavy_pred = [p.intent for p in heavy.predict([Item(t, "en", None) for t in held.texts])]
    heavy_right = np.array([p == c for p, c in zip(heavy_pred, held.labels, strict=True)])

    def load(blob: bytes) -> CharNgramClassifier:
        return CharNgramClassifier.load(io.BytesIO(blob), labels)

    seed_point = measure("seed (10% of train)", 0, load(seed_weights), held.texts, truth, heavy_right, args.budget)
    measured = {v: measure(v, int(m["data"]["examples"]), load(weights[v]), held.texts, truth, heavy_right,
                           args.budget) for v, m in manifests.items()}
    points = [seed_point] + [measured[e["version"]] for e in promoted]
    full = measure("light trained on all of train", len(train.texts), full_light, held.texts, truth, heavy_right,
                   args.budget)
    png = PNG if args.write else work / "learning.png"
    plot(points, full, png)
    print(body := report(args, points, full, decided, measured, rollbacks, manifests, unlabelled,
                         late_heavy, with_labels,
                         state, float(heavy_right.mean()), seed_report, len(rows), len(labelled.texts),
                         len(held.texts), minutes, png, backfilled, settled))
    if args.write:
        write_section("A cascade that learns from its own traffic", body)


def last_candidate(decided: list[dict[str, Any]], measured: dict[str, Point], manifests: dict[str, dict[str, Any]],
                   full: Point) -> str:
    """A line on the last candidate when the gate refused it: what the model trained on the most reached, and
    the interval it could not clear."""
    if not decided or decided[-1]["action"] != "reject":
        return ""
    ev = manifests[decided[-1]["version"]]["evaluation"]
    p, a = measured[decided[-1]["version"]], ev.get("pooled") or ev["agreement"]
    kind = "held-out and cross-fitted" if "pooled" in ev else "held-out"
    return (f"- The last candidate, trained on the most ({p.examples:,}), reaches {p.light:.2%} light-only "
            f"({(full.light - p.light) * 100:.2f} points from the reference), but the gate could not tell it from "
            f"the live model: agreement delta [{a['lo']:+.1%}, {a['hi']:+.1%}] on {a['n']:,} {kind} answers, "
            f"about {(a['hi'] - a['lo']) * 50:.1f} points either side; it narrows as 1/sqrt(n) with traffic.\n")


def decision(e: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The table's decision cell: the held-out interval, and the cross-fitted one the gate used when there was one."""
    ev = manifest["evaluation"]
    a, pooled = ev["agreement"], ev.get("pooled")
    verdict = "**promoted**" if e["action"] == "promote" else "rejected"
    cell = f"{verdict}: {a['candidate']:.1%} vs {a['live']:.1%}, [{a['lo']:+.1%}, {a['hi']:+.1%}] (n={a['n']:,})"
    if pooled is not None:
        cell += f"; cross-fitted [{pooled['lo']:+.1%}, {pooled['hi']:+.1%}] (n={pooled['n']:,})"
    return cell


def crossfit_mattered(decided: list[dict[str, Any]], manifests: dict[str, dict[str, Any]],
                      measured: dict[str, Point]) -> str:
    """A line naming the promotions the held-out slice alone would have refused (its interval reaching the margin)."""
    margin = Settings().learn.margin
    names = [f"{measured[e['version']].examples:,} examples" for e in decided if e["action"] == "promote"
             and "pooled" in manifests[e["version"]]["evaluation"]
             and manifests[e["version"]]["evaluation"]["agreement"]["lo"] <= margin]
    if not names:
        return ""
    return (f"- Promoted on cross-fitted evidence where the held-out slice alone could not tell: the model trained "
            f"on {', '.join(names)} (its held-out interval reaches the margin; the pooled one clears it).\n")


def crossfit_cost(manifests: dict[str, dict[str, Any]]) -> str:
    """What cross-fitting cost the retrainings that did it."""
    runs = [m.get("training", {}) for m in manifests.values()]
    runs = [t for t in runs if t.get("crossfit_seconds") is not None]
    if not runs:
        return ""
    fit = sum(float(t["train_seconds"]) for t in runs)
    extra = sum(float(t["crossfit_seconds"]) for t in runs)
    folds = Settings().learn.crossfit_folds
    return (f"- Cross-fitting ({folds} folds of the examples the live model never saw) in {len(runs)} retrainings: "
            f"{extra:.0f} s of fits beside the candidates' own {fit:.0f} s, in the trainer's child process.\n")


def report(args: argparse.Namespace, points: list[Point], full: Point, decided: list[dict[str, Any]],
           measured: dict[str, Point], rollbacks: list[dict[str, Any]],
           manifests: dict[str, dict[str, Any]], unlabelled: dict[str, int], late_heavy: float,
           with_labels: dict[str, int], state: dict[str, Any], heavy_acc: float,
           seed_report: dict[str, Any], n_stream: int, n_labelled: int, n_eval: int, minutes: float,
           png: Path, backfilled: int, settled: bool) -> str:
    def pct(x: float | None) -> str:
        return "not reached" if x is None else f"{x:.1%}"

    rows = ["| light model | trained on (besides the seed) | decision: agreement with heavy, candidate vs live, on "
            "held-out traffic (and cross-fitted on the new examples) | light-only accuracy | cascade accuracy at the "
            "budget | heavy share for 93.5% |",
            "|---|---:|---|---:|---:|---:|"]

    def row(p: Point, ev: str) -> str:
        return (f"| {p.name} | {p.examples:,} | {ev} | {p.light:.2%} | {p.cascade:.2%} | "
                f"{pct(p.share_needed)} |")

    rows.append(row(points[0], "the start"))
    for e in decided:
        rows.append(row(measured[e["version"]], decision(e, manifests[e["version"]])))
    rows.append(row(Point(f"{full.name} (reference)", full.examples, full.light, full.cascade, full.share_needed),
                    "-"))
    start, end = points[0], points[-1]
    within = full.light - end.light <= 0.01
    if start.share_needed and end.share_needed is not None:
        fall = 1 - end.share_needed / start.share_needed
        fall_txt = f"{start.share_needed:.1%} -> {end.share_needed:.1%}: {fall:.0%} lower"
        fall_ok = fall >= 0.30
    else:
        fall_txt, fall_ok = f"{pct(start.share_needed)} -> {pct(end.share_needed)}", False
    total = sum(unlabelled.values()) or 1
    heavy_share = unlabelled.get("heavy", 0) / total
    verdicts = state.get("verdicts", {})
    rel = png.resolve().relative_to(ROOT) if png.resolve().is_relative_to(ROOT) else png
    return (
        f"BANKING77: the light model starts from 10% of train ({seed_report['n_train']:,} messages, stratified, seed "
        f"{args.seed}); {n_stream:,} messages of the other 90% stream through the embedded pipeline at "
        f"{args.rate:.0f} msg/s as unlabelled traffic (heavy budget {args.budget:.0%}, {args.shadow:.0%} of light's "
        f"traffic shadowed on heavy; the trainer's defaults but retraining after {args.retrain_every} new examples "
        f"(and {Settings().learn.retrain_growth:.0%} of the last retraining's) or {args.retrain_s:.0f} s, and "
        f"accepting {args.per_minute:,} a minute), "
        + (f"then the stream replayed once through the backfill lane with `--shadow` (heavy on every record, "
           f"nobody answered; {backfilled:,} examples accepted by the end of it), " if args.backfill else "")
        + f"then {n_labelled:,} messages of test (10%) as labelled traffic. Every promoted "
        f"version is measured on the other {n_eval:,} messages of test, never streamed; heavy (the banking pack's "
        f"MiniLM, the teacher) is {heavy_acc:.2%} on them. Run time {minutes:.0f} min.\n\n"
        + "\n".join(rows) + "\n\n"
        f"- Light-only accuracy within 1 point of a light model trained on all of train: {end.light:.2%} vs "
        f"{full.light:.2%}: **{'met' if within else 'not met'}**.\n"
        + last_candidate(decided, measured, manifests, full)
        + f"- Heavy share needed for {TARGET:.1%} falls by >= 30%: {fall_txt}: **{'met' if fall_ok else 'not met'}**.\n"
        f"- The trainer: {len(points) - 1} promoted, {len(decided) - len(points) + 1} rejected (their interval did "
        f"not clear the margin), {len(rollbacks)} rolled back; examples offered: {verdicts}; held at the end: "
        f"{state.get('training_examples', 0):,} to train on, {state.get('held_out', 0):,} held out. Every candidate "
        f"is measured on the evaluation slice (rejected ones too: the gate's decisions can be checked).\n"
        + ("" if settled else f"- **The run ended with examples the trainer had not yet judged** "
                              f"({state.get('new_since_training', 0):,} new since its last retraining, training now: "
                              f"{state.get('training_now')}): the table stops short of what it would reach.\n")
        + crossfit_mattered(decided, manifests, measured) + crossfit_cost(manifests) +
        f"- Answers during the unlabelled stream: light {unlabelled.get('light', 0) / total:.1%}, heavy "
        f"{heavy_share:.1%}; heavy {late_heavy:.1%} of its second half, against the {args.budget:.0%} budget: "
        + ("**held**" if late_heavy <= args.budget + 0.02 else
           "**not held** (the feedback agent moves `length_threshold` at most 25% and `escalate_below` 0.05 a "
           "change, and watches each change for two 30 s windows before the next; many BANKING77 messages are "
           "over the 50-character rule and go to heavy by rule)")
        + f"; during the labelled phase: {with_labels}. The offline columns apply the budget exactly.\n\n"
        f"![learning]({rel})\n"
    )


if __name__ == "__main__":
    main()

"""Feedback agent throughput: how many result records per second the agent keeps up with.

Produces N synthetic result records (schemas/result.v1.json: light answers, escalations, heavy
answers, shadow predictions, half of them labeled) to the results topic of a fresh prefix on the
embedded broker (that topic unbounded: noida keeps 1 MiB a partition of the others), then starts the
agent (`python -m pipeline.agents.feedback`, one process) and times it draining the backlog, from its Redis
state snapshots. Also times the statistics alone (decode + Aggregator) per record, in process.

    python bench/feedback.py [--results 200000] [--rounds 2] [--write]    (or python -m bench.feedback)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import redis

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, drop_topics, embedded_services, fresh_topics, recorded, write_section
from pipeline.adapters.kafka import (
    Tail,
    make_producer,
    produce,
    topics_of,
)
from pipeline.contracts.keys import Keys
from pipeline.core.stats import AggConfig, Aggregator
from pipeline.settings import Settings

INTENTS = ["card_arrival", "card_not_working", "exchange_rate", "pin_blocked", "transfer_fee_charged"]


def result(rid: str, tier: str, *, conf: float, final: bool, escalated: bool = False, shadow: bool = False,
           intent: str = "card_arrival", label: str | None = None, total_ms: float = 20.0, chars: int = 30,
           version: int = 1, now_ms: int | None = None) -> dict[str, Any]:
    """A schema-valid result record."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    return {
        "request_id": rid, "user_id": None, "answer": "" if not final else "ok", "intent": intent,
        "confidence": conf, "tier": tier, "model": "charngram" if tier == "light" else "minilm",
        "escalated": escalated, "degraded": False, "route_reason": "shadow" if shadow else "short",
        "timings_ms": {"ingest": 0.5, "queue": 2.0, "inference": 1.0, "total": total_ms},
        "replay": False, "threshold_version": version, "lang": "en", "answered_at": now,
        "final": final, "stage": tier, "shadow": shadow,
        "features": {"chars": chars, "tokens": chars // 5, "script": "en", "lang": "en", "has_image": False,
                     "image_bytes": 0, "vip": False, "question": True, "complaint": False, "urgent": False},
        "timestamps": {"received": now, "ingested": now, "dequeued": now, "inferred": now, "produced": now},
        "batch_size": 16, "worker_id": "bench", "label": label,
        "light_intent": None, "light_confidence": None,
    }


def records(n: int, seed: int = 7) -> list[bytes]:
    """About n records of a plausible mix; every request id gets its light and heavy stages."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        rid = f"bench-{i}"
        i += 1
        truth = rnd.choice(INTENTS)
        label = truth if rnd.random() < 0.5 else None
        guess = truth if rnd.random() < 0.85 else rnd.choice(INTENTS)
        conf = rnd.random()
        roll = rnd.random()
        if roll < 0.2:  # heavy by rule
            out.append(orjson.dumps(result(rid, "heavy", conf=0.9, final=True, intent=truth, label=label,
                                           total_ms=300.0, chars=120)))
        elif conf < 0.2:  # escalated: the light stage, then heavy's answer
            out.append(orjson.dumps(result(rid, "light", conf=conf, final=False, intent=guess, label=label)))
            out.append(orjson.dumps(result(rid, "heavy", conf=0.9, final=True, escalated=True, intent=truth,
                                           label=label, total_ms=320.0)))
        else:
            out.append(orjson.dumps(result(rid, "light", conf=conf, final=True, intent=guess, label=label)))
            if roll > 0.95:  # shadowed on heavy
                out.append(orjson.dumps(result(rid, "heavy", conf=0.9, final=False, shadow=True, intent=truth,
                                               total_ms=300.0)))
    return out[:n]


def backlog_topics(base: Settings) -> Settings:
    """Like `fresh_topics(base)` (new uuid-named topics and Redis keys), but the results topic keeps a whole run's
    backlog (1 GiB a partition), as `fresh_topics(base, backlog=True)` does for the requests topic.

    The embedded noida bounds every topic to 1 MiB a partition and applies the bound as records arrive: 200,000
    results (about 3 MiB a partition, compressed) lost their oldest 128,000 while the topic was being filled, and
    the agent, having counted the 72,000 left within seconds, waited for the rest until the round timed out (which
    read as a drain of about 120 results/s at 13% CPU: its idle polling)."""
    return fresh_topics(base, backlog=True, whole="results")


def fill(s: Settings, topic: str, msgs: list[bytes]) -> None:
    p = make_producer(s, **{"linger.ms": 20})
    for i, m in enumerate(msgs):
        produce(p, topic, m, key=str(i % 5000))
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)


def check_kept(s: Settings, topic: str, n: int, settle_s: float = 3.0) -> None:
    """Fail unless the topic holds all n records from offset 0 for `settle_s` (noida applies a topic's bound a
    fraction of a second after the writes, measured 0.3-0.7 s): a bounded topic would have the agent wait for
    deleted records until the round times out. A Tail reads the offsets because it knows tansu's ListOffsets count
    batches, not records."""
    deadline = time.monotonic() + settle_s
    while True:
        tail = Tail(s, topic, start="beginning", timeout=30)
        try:
            lows, highs = dict(tail.next), dict(tail.ends)
        finally:
            tail.close()
        if any(lows.values()) or sum(highs.values()) != n:
            marks = [(lows[p], highs[p]) for p in sorted(highs)]
            raise SystemExit(f"{topic} does not hold the {n} records produced (a retention bound?): "
                             f"(low, high) offsets per partition {marks}")
        if time.monotonic() >= deadline:
            return
        time.sleep(0.5)


def observed(r: redis.Redis, key: str) -> int:
    raw = r.get(key)
    return int(orjson.loads(raw)["agg"]["counters"]["observed"]) if raw else 0


def agent_round(s: Settings, n: int, timeout: float) -> float:
    """Start the agent on a backlog of n records; results/s from its first to its last snapshot."""
    env = s.with_env()
    env.update(TIERFLOW_FEEDBACK_INTERVAL_S="0.25", TIERFLOW_FEEDBACK_WINDOW_S="600",
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.agents.feedback"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    r = redis.Redis.from_url(s.redis.address)
    key = Keys(s.redis.prefix).feedback_state
    first: tuple[float, int] | None = None
    last = (0.0, 0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            seen = observed(r, key)
            now = time.monotonic()
            if seen and first is None:
                first = (now, seen)
            if seen > last[1]:
                last = (now, seen)
            if seen >= n:
                break
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    if first is None or last[1] < n:
        raise SystemExit(f"the agent counted {last[1]} of {n} records; its log:\n{err.decode()[-3000:]}")
    if last[1] == first[1]:  # a backlog drained before the first snapshot (a tiny sample): time it from the start
        return n / max(1e-9, last[0] - started)
    return (last[1] - first[1]) / max(1e-9, last[0] - first[0])


def stats_us(msgs: list[bytes]) -> float:
    """Microseconds per record for decode + statistics alone."""
    agg = Aggregator(AggConfig(window_ms=600_000))
    now = int(time.time() * 1000)
    t0 = time.perf_counter()
    for m in msgs:
        agg.add_result(orjson.loads(m), now)
    return (time.perf_counter() - t0) / len(msgs) * 1e6


def against_pipeline(rate: float) -> str:
    """The agent's rate beside the pipeline's, as the pipeline benchmarks recorded them in BENCHMARKS.md."""
    product = recorded("Against the design article's service", "tierflow", 1)
    echo = recorded("End-to-end pipeline", "pipeline, echo model | flat out", 3)
    lines = []
    if product:
        lines.append(f"the product (packaged models, all tiers on these 2 cores) answers {product:,.0f} msg/s flat "
                     f"out: the agent keeps up {rate / product:,.0f} times over")
    if echo:
        verdict = ("keeps up" if rate >= echo else
                   f"does not keep up ({rate / echo:.0%} of it): at such rates its windows lag behind the stream "
                   "(it reads a backlog, never drops) and the controller acts on older statistics")
        lines.append(f"the echo pipeline (no models) answers {echo:,.0f} msg/s flat out: the agent {verdict}")
    if not lines:
        return ""
    return ("\nAgainst the pipeline's rate (from the sections below, same machine): "
            + "; ".join(lines) + ". One result record per answer, plus one per escalation.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2, help="rounds on fresh topics (median reported)")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--quick", action="store_true", help="50,000 results, one round")
    args = ap.parse_args()
    if args.quick:
        args.results, args.rounds = 50_000, 1

    rates: list[float] = []
    with embedded_services() as base:
        msgs = records(args.results)
        us = stats_us(msgs[:50_000])
        for k in range(args.rounds):
            s = backlog_topics(base)
            fill(s, topics_of(s).results, records(args.results, seed=k))
            try:
                check_kept(s, topics_of(s).results, args.results)
                rates.append(agent_round(s, args.results, timeout=600))
            finally:
                drop_topics(s)  # noida re-serialises all it keeps on every write: a round left behind slows the next
            print(f"round {k + 1}: {rates[-1]:,.0f} results/s")
    rate = statistics.median(rates)
    load = os.getloadavg()[0]
    body = (
        f"{args.results:,} synthetic result records (light answers, escalations, heavy answers, shadow "
        "predictions; half labeled) on the embedded broker as a backlog (its results topic kept whole, checked before "
        "the agent starts); one agent process "
        "(faust-streaming, `take_events(2000, within=0.2)`, aiokafka) drains it while its control loop runs "
        f"every 0.25 s. Median of {args.rounds} rounds on fresh topics, timed from its Redis snapshots.\n\n"
        "| what | rate |\n|---|---:|\n"
        f"| feedback agent, end to end | {rate:,.0f} results/s |\n"
        f"| decode + statistics alone (in process) | {1e6 / us:,.0f} results/s ({us:.1f} µs/record) |\n\n"
        f"The statistics are {us / (1e6 / rate):.0%} of the agent's time per record; the rest is faust's "
        "consumer and stream machinery (aiokafka fetches, events, acks). "
        f"Load average while measuring: {load:.1f} (other work shares this machine).\n"
        + against_pipeline(rate)
    )
    print(body)
    if args.write:
        write_section("Feedback agent throughput", body)


if __name__ == "__main__":
    main()

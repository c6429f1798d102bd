"""End-to-end pipeline benchmark on the embedded stack: throughput and latency, beside the bare broker.

- Throughput: N requests as fast as the producer goes; answers/s from the first request sent to the
  last answer read, with the echo model (the pipeline alone) and with the real models (the product).
- Latency at a fixed offered load: p50/p95/p99 from the request's send time to its answer read by a
  consumer, side by side with the bare broker's produce -> consume round trip at the same load.
- Memory: peak RSS (VmHWM) per process type during the fixed-load run.

    python -m bench.pipeline [--quick] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench.common import (
    SHOP_TEXTS,
    AnswerReader,
    Run,
    embedded_services,
    fresh_topics,
    missing_note,
    run_ids,
    summarize,
    write_section,
)
from pipeline.adapters.kafka import make_producer, produce, topics_of
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings

ECHO = {"TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_HEAVY_MODEL": "echo", "TIERFLOW_MULTIMODAL_MODEL": "echo",
        "TIERFLOW_ZH_MODEL": ""}


def percentiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0], xs[0]) if xs else (0.0, 0.0, 0.0)
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return q[49], q[94], q[98]


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def send(s: Settings, topic: str, ids: list[str], rate: float | None, with_id_key: bool = True,
         texts: Sequence[str] = SHOP_TEXTS, users: Sequence[str] | None = None) -> dict[str, float]:
    """Send one request per id, `texts` in turn (at `rate` msg/s, or flat out); return the send time per id (epoch s).
    `users`: each request's customer (its `user_id` and key), in turn.

    At a rate each request leaves at once (linger 0), as a client calling a service would send it."""
    p = make_producer(s, **{"linger.ms": 0 if rate else 20})
    sent_at: dict[str, float] = {}
    t0 = time.monotonic()
    for i, rid in enumerate(ids):
        now = time.time()
        if users:
            user = users[i % len(users)]
            produce(p, topic, orjson.dumps({"id": rid, "user_id": user, "text": texts[i % len(texts)]}), key=user)
        else:
            produce(p, topic, orjson.dumps({"id": rid, "text": texts[i % len(texts)]}),
                    key=rid if with_id_key else None)
        sent_at[rid] = now
        if i % 500 == 0:
            p.poll(0)
        if rate:
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    p.flush(60)
    return sent_at


def measure(s: Settings, topic_in: str, topic_out: str, n: int, rate: float | None, timeout: float,
            texts: Sequence[str] = SHOP_TEXTS) -> Run:
    """Send n requests to `topic_in` and time their answers on `topic_out`.

    Only this run's ids count (the topic may hold earlier runs' answers), and the wait lasts until
    every one is answered or `timeout` s pass after sending; answers still missing then are reported
    as missing (`Run.missing`), never left out of the percentiles silently.
    """
    ids = run_ids(n)
    reader = AnswerReader(s, topic_out, ids).start()
    t0 = time.time()
    sent_at = send(s, topic_in, ids, rate, texts=texts)
    gave_up_at = reader.wait(timeout)
    reader.stop()
    return summarize(sent_at, reader.log, t0, gave_up_at)


def measure_bare(s: Settings, n: int, rate: float | None, timeout: float) -> Run:
    """The bare broker: n records produced to one topic and consumed back from it."""
    topic = topics_of(s).labels
    return measure(s, topic, topic, n, rate, timeout)


def start_pipeline(s: Settings, env: dict[str, str], light_workers: int,
                   budget: bool = False) -> tuple[Stack, dict[str, list[int]]]:
    """Ingest and the three tiers on `s`'s broker and Redis. `budget`: each agent's model threads from the core
    budget, as `tierflow up` gives them (pipeline/ops/devstack.py thread_budget)."""
    from pipeline.ops.devstack import thread_budget
    from tests.integration.helpers import wait_ready

    threads = thread_budget(s)[1] if budget else {}

    def env_of(agent: str) -> dict[str, str | None]:
        return {**env, "TIERFLOW_THREADS": str(threads[agent])} if agent in threads else {**env}

    stack = Stack(s)
    pids: dict[str, list[int]] = {"ingest": [], "worker": []}
    pids["ingest"].append(stack.start_agent("ingest", "ingest", env=env_of("ingest")).popen.pid)
    for i in range(light_workers):
        pids["worker"].append(stack.start_agent(f"light-{i}", "worker", "--tier", "light",
                                                env=env_of("worker-light")).popen.pid)
    for tier in ("heavy", "multimodal"):
        pids["worker"].append(stack.start_agent(tier, "worker", "--tier", tier, env=env_of(f"worker-{tier}")).popen.pid)
    wait_ready(s, ["light", "heavy", "multimodal"], timeout=300)
    time.sleep(2)
    return stack, pids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller runs (minutes, not tens of minutes)")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--flat", type=int, default=None, help="requests of the flat-out runs (100,000; quick 20,000)")
    ap.add_argument("--seconds", type=float, default=None, help="length of the fixed-load runs (10 s; quick 5 s)")
    ap.add_argument("--light-workers", type=int, default=2,
                    help="light worker processes (2: one waits on broker acks while the other works)")
    args = ap.parse_args()
    n_flat = args.flat or (20_000 if args.quick else 100_000)
    fixed_rate, fixed_s = 1000.0, args.seconds or (5 if args.quick else 10)

    rows: list[str] = []
    mem: dict[str, float] = {}
    n_fixed = int(fixed_rate * fixed_s)
    with embedded_services() as base:
        broker = base.embedded.broker
        # Each run on topics of its own: tansu's in-memory log slows down with the number of batches a
        # partition holds (see "The log" below), so a run must not inherit another's log.
        bare_fixed = measure_bare(fresh_topics(base), n_fixed, fixed_rate, 60)
        s = fresh_topics(base)  # one topic for the three windows: each adds to the same log
        growth = [measure_bare(s, n_fixed, fixed_rate, 60) for _ in range(3)]
        bare_flat = measure_bare(fresh_topics(base), n_flat, None, 120)

        # The pipeline with the echo model: the fixed load first, then flat out on fresh topics.
        s = fresh_topics(base)
        stack, pids = start_pipeline(s, ECHO, light_workers=args.light_workers)
        try:
            echo_fixed = measure(s, topics_of(s).requests, topics_of(s).answers, n_fixed, fixed_rate, 120)
            for kind, ps in pids.items():
                mem[f"echo {kind}"] = max(peak_rss_mb(p) for p in ps)
        finally:
            stack.stop()
        s = fresh_topics(base)
        stack, pids = start_pipeline(s, ECHO, light_workers=args.light_workers)
        try:
            echo_flat = measure(s, topics_of(s).requests, topics_of(s).answers, n_flat, None, 300)
        finally:
            stack.stop()

        # The product: packaged models.
        s = fresh_topics(base)
        # the packaged classifiers; the writer's seconds a reply are bench.generation's
        stack, pids = start_pipeline(s, {"TIERFLOW_HEAVY_GENERATOR": "none"}, light_workers=args.light_workers)
        real_rate = 100.0
        try:
            real_fixed = measure(s, topics_of(s).requests, topics_of(s).answers, int(real_rate * fixed_s), real_rate,
                                 300)
            for kind, ps in pids.items():
                mem[f"models {kind}"] = max(peak_rss_mb(p) for p in ps)
        finally:
            stack.stop()

    def row(name: str, r: Run, load: str) -> str:
        return f"| {name} | {load} | {r.answered}/{r.sent} | {r.rate:,.0f} | " + " | ".join(r.cells()) + " |"

    rows = [
        "| path | offered load | answered | msg/s | p50 ms | p95 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
        row("bare broker produce → consume", bare_flat, "flat out"),
        row("pipeline, echo model", echo_flat, "flat out"),
        row("bare broker produce → consume", bare_fixed, f"{fixed_rate:.0f} msg/s"),
        row("pipeline, echo model", echo_fixed, f"{fixed_rate:.0f} msg/s"),
        row("pipeline, packaged models", real_fixed, f"{real_rate:.0f} msg/s"),
    ]
    echo_p99, bare_p99 = echo_fixed.percentiles([99])[0], bare_fixed.percentiles([99])[0]
    added = (f"{echo_p99 - bare_p99:.1f} ms" if echo_p99 is not None and bare_p99 is not None
             else "not known (answers missing)")
    mem_rows = "\n".join(f"| {k} | {v:.0f} |" for k, v in mem.items())
    growth_rows = "\n".join(
        f"| {(i + 1) * n_fixed:,} | {r.answered}/{r.sent} | " + " | ".join(r.cells()) + " |"
        for i, r in enumerate(growth))
    missing = missing_note({"bare flat out": bare_flat, "echo flat out": echo_flat, "bare fixed": bare_fixed,
                            "echo fixed": echo_fixed, "models fixed": real_fixed,
                            **{f"log window {i + 1}": r for i, r in enumerate(growth)}})
    body = (
        "Latency is measured from the producer's send to the answer read by a consumer. Request ids are unique "
        "to a run and the reader starts at the topic's end, so a run counts only its own answers and waits "
        "for every one of them: the percentiles are over all of its answers. Processes: ingest, "
        f"{args.light_workers} light, one heavy and one multimodal worker, each its own process, on the embedded "
        f"{broker} broker; the producer and the consumer run in the benchmark process on the same 2 cores. Under "
        "the flat-out load ingest's health check may degrade heavy-bound requests to light (heavy lag), as in "
        f"production. Each run has topics of its own; the fixed-load runs last {fixed_s:.0f} s.\n\n"
        + "\n".join(rows)
        + (f"\n\n{missing}" if missing else "")
        + f"\n\nAdded p99 over the bare broker at {fixed_rate:.0f} msg/s (echo model): {added}. "
        f"1-minute load average at the end: {os.getloadavg()[0]:.1f} (above ~2 other work shared the 2 cores and "
        "every hop's broker round trip waited for CPU).\n\n"
        "Peak RSS per process type (MB):\n\n| process | peak RSS MB |\n|---|---:|\n" + mem_rows + "\n\n"
        f"**The log.** The bare {broker} broker alone, {fixed_rate:.0f} msg/s of small batches into one topic, "
        f"{n_fixed:,} records per window, the topic growing from one window to the next (tansu's in-memory storage "
        "walks a partition's batches on each fetch, so its latency grows with the log; noida's does not):\n\n"
        "| records in the topic at the window's end | answered | p50 ms | p95 ms | p99 ms |\n"
        "|---:|---|---:|---:|---:|\n"
        + growth_rows + "\n\nThe pipeline writes every message to four topics (requests, a tier, results, "
        "answers), each in batches of a few records at this load, so its log grows four times as fast. Hours of "
        "load are measured in \"Sustained load per embedded broker\". Sustained "
        "traffic belongs on Apache Kafka (`docker-compose.yml`); the embedded broker is for the demo, the "
        "tests and these comparisons.\n"
    )
    print(body)
    if args.write:
        write_section("End-to-end pipeline", body)


if __name__ == "__main__":
    main()

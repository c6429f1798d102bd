"""Sustained load on each embedded broker: latency minute by minute, and what the broker costs while it runs.

For each broker (noida, then tansu), on a broker of its own:
1. the bare broker: `--rate` msg/s produced to one topic and consumed back, for `--minutes`;
2. the whole pipeline (ingest, one light worker as `tierflow up` runs (`--light-workers`), heavy, multimodal;
   echo models) at the same rate, for the same minutes, on fresh topics.
Per minute of send time: p50/p95/p99 of each, the pipeline's p99 over the bare broker's p99 in the same
minute of its own run, and the broker process's CPU (% of one core) and RSS at the end of the minute.

    python -m bench.sustained [--minutes 10] [--rate 1000] [--brokers noida,tansu] [--quick] [--write]

`--backlog N` adds a catch-up row: a consumer N records behind (1 KiB records, one topic without the
embedded retention bounds) reads them all.

`--packaged-rates 50,100,...` then runs the pipeline with the packaged models (the classifiers; the writer's
seconds a reply are bench.generation's) on the first broker at each rate in turn, for `--minutes` each, and
reports the highest rate it holds: every request answered and every minute's p99 under `--packaged-p99` ms
(250). The sweep stops at the first rate it does not hold.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import orjson
from confluent_kafka.admin import NewTopic

from bench.common import SHOP_TEXTS as TEXTS
from bench.common import fresh_topics, run_dir, write_section
from bench.pipeline import ECHO, percentiles, start_pipeline
from pipeline.adapters.brokers import BrokerName
from pipeline.adapters.kafka import Tail, make_admin, make_consumer, make_producer, produce, topics_of
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings


# --------------------------------------------------------------------------- the broker process
def cpu_seconds(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@contextlib.contextmanager
def broker_stack(broker: str) -> Iterator[tuple[Settings, int]]:
    """An embedded broker and Redis of this benchmark's own; yields settings that dial them and the broker pid."""
    with run_dir(broker) as data:
        base = Settings(kafka_port=free_port(), redis_port=free_port(), data_dir=data,
                        embedded_broker=cast(BrokerName, broker))
        stack = Stack(base)
        stack.start_services()
        try:
            s = stack.settings.updated(kafka_bootstrap=base.kafka.servers, redis_url=base.redis.address)
            yield s, stack.find("broker").popen.pid
        finally:
            stack.stop()


class BrokerSampler:
    """Every `every_s`: the broker's CPU (% of one core over the interval) and RSS."""

    def __init__(self, pid: int, every_s: float = 60.0) -> None:
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float]] = []  # (cpu %, rss MiB)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BrokerSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        last, t = cpu_seconds(self.pid), time.monotonic()
        while not self._stop.wait(self.every_s):
            now, c = time.monotonic(), cpu_seconds(self.pid)
            self.samples.append((100 * (c - last) / (now - t), rss_mib(self.pid)))
            last, t = c, now


# --------------------------------------------------------------------------- one run
def window_s(minutes: float) -> float:
    """The latency buckets: a minute, or a quarter of a run shorter than two."""
    return 60.0 if minutes >= 2 else minutes * 60 / 4


def window_name(every: float) -> str:
    return "minute" if every == 60 else f"{every:.0f} s window"


@dataclass
class Minutes:
    """Latencies bucketed by the minute (of the run) each request was sent in."""

    sent: int = 0
    answered: int = 0
    by_minute: dict[int, list[float]] = field(default_factory=dict)

    def p(self, minute: int) -> tuple[float, float, float]:
        return percentiles(self.by_minute.get(minute, []))


def timed_run(s: Settings, topic_in: str, topic_out: str, rate: float, seconds: float, tail_s: float = 60.0,
              every_s: float = 60.0) -> Minutes:
    """Send at `rate` for `seconds` to `topic_in`; time each answer on `topic_out` (read by a Tail taken before
    the first send, so nothing is missed); wait until every id sent is answered or `tail_s` after the end."""
    tail = Tail(s, topic_out, "end")
    read_at: dict[str, float] = {}
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for m in tail.poll(0.05, 5000):
                now = time.time()
                key = m.key()
                rid = key.decode() if key else str(orjson.loads(m.value() or b"{}").get("request_id"))
                read_at.setdefault(rid, now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    p = make_producer(s, **{"linger.ms": 1})
    tag = uuid.uuid4().hex[:6]
    sent_at: dict[str, float] = {}
    t0 = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        rid = f"{tag}-{i}"
        sent_at[rid] = time.time()
        produce(p, topic_in, orjson.dumps({"id": rid, "text": TEXTS[i % len(TEXTS)]}), key=rid)
        p.poll(0)
        ahead = (i + 1) / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    p.flush(60)
    deadline = time.monotonic() + tail_s
    while len(read_at.keys() & sent_at.keys()) < len(sent_at) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    reader.join(5)
    tail.close()
    out = Minutes(sent=len(sent_at))
    start = min(sent_at.values())
    for rid, t in sent_at.items():
        if rid in read_at:
            out.answered += 1
            out.by_minute.setdefault(int((t - start) // every_s), []).append((read_at[rid] - t) * 1000)
    return out


def backlog_catch_up(s: Settings, n: int) -> tuple[float, int]:
    """A consumer `n` 1-KiB records behind on a topic without retention bounds reads them all: (seconds, read)."""
    topic = f"bench-backlog-{uuid.uuid4().hex[:6]}"
    admin = make_admin(s)
    admin.create_topics([NewTopic(topic, s.partitions, 1)])[topic].result()
    p = make_producer(s, **{"linger.ms": 20, "compression.type": "none"})
    for i in range(n):
        produce(p, topic, os.urandom(1024), key=str(i))  # incompressible: the fetch is as big as the log
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)
    c = make_consumer(s, f"bench-backlog-{uuid.uuid4().hex[:6]}")
    c.subscribe([topic])
    got, t0 = 0, time.monotonic()
    while got < n and time.monotonic() - t0 < 300:
        got += sum(1 for m in c.consume(10_000, 1.0) if m.error() is None)
    took = time.monotonic() - t0
    c.close()
    admin.delete_topics([topic])
    return took, got


# --------------------------------------------------------------------------- the benchmark
@dataclass
class BrokerResult:
    broker: str
    bare: Minutes
    pipe: Minutes
    bare_broker: list[tuple[float, float]]
    pipe_broker: list[tuple[float, float]]
    backlog: tuple[float, int] | None = None


def run_broker(broker: str, minutes: float, rate: float, backlog: int, light_workers: int) -> BrokerResult:
    seconds = minutes * 60
    every = window_s(minutes)
    with broker_stack(broker) as (base, pid):
        s = fresh_topics(base)
        with BrokerSampler(pid, every) as bare_cpu:
            bare = timed_run(s, topics_of(s).labels, topics_of(s).labels, rate, seconds, every_s=every)
        s = fresh_topics(base)
        stack, _ = start_pipeline(s, ECHO, light_workers=light_workers)
        try:
            with BrokerSampler(pid, every) as pipe_cpu:
                pipe = timed_run(s, topics_of(s).requests, topics_of(s).answers, rate, seconds, every_s=every)
        finally:
            stack.stop()
        caught = backlog_catch_up(base, backlog) if backlog else None
    return BrokerResult(broker, bare, pipe, bare_cpu.samples, pipe_cpu.samples, caught)


@dataclass
class RateResult:
    rate: float
    run: Minutes
    broker: list[tuple[float, float]]

    def worst_p99(self) -> float:
        return max((self.run.p(m)[2] for m in self.run.by_minute), default=float("inf"))

    def held(self, p99_ms: float) -> bool:
        return self.run.answered == self.run.sent and self.worst_p99() < p99_ms


PACKAGED = {"TIERFLOW_HEAVY_GENERATOR": "none"}


def packaged_sweep(broker: str, rates: list[float], minutes: float, p99_ms: float,
                   light_workers: int) -> list[RateResult]:
    """The pipeline on the packaged models at each rate (lowest first, fresh topics and agents each), until one
    rate is not held."""
    seconds = minutes * 60
    every = window_s(minutes)
    out: list[RateResult] = []
    with broker_stack(broker) as (base, pid):
        for rate in sorted(rates):
            print(f"== {broker}, packaged models: {minutes:g} min at {rate:.0f} msg/s", flush=True)
            s = fresh_topics(base)
            stack, _ = start_pipeline(s, PACKAGED, light_workers=light_workers, budget=True)
            try:
                with BrokerSampler(pid, every) as cpu:
                    run = timed_run(s, topics_of(s).requests, topics_of(s).answers, rate, seconds, every_s=every)
            finally:
                stack.stop()
            out.append(RateResult(rate, run, cpu.samples))
            print(f"   answered {run.answered:,}/{run.sent:,}, worst p99 {out[-1].worst_p99():.1f} ms", flush=True)
            if not out[-1].held(p99_ms):
                break
    return out


def sweep_table(results: list[RateResult], p99_ms: float, every: float) -> str:
    unit = window_name(every)
    lines = [f"| offered msg/s | answered | p50 / p95 / p99 ms, whole run | worst p99 in a {unit} ms | "
             "broker CPU % (mean) | held |", "|---:|---:|---|---:|---:|---|"]
    for r in results:
        everything = [x for xs in r.run.by_minute.values() for x in xs]
        p50, p95, p99 = percentiles(everything)
        cpu = sum(c for c, _ in r.broker) / len(r.broker) if r.broker else float("nan")
        lines.append(f"| {r.rate:.0f} | {r.run.answered:,}/{r.run.sent:,} | {p50:.1f} / {p95:.1f} / {p99:.1f} | "
                     f"{r.worst_p99():.1f} | {cpu:.0f} | {'yes' if r.held(p99_ms) else 'no'} |")
    held = [r.rate for r in results if r.held(p99_ms)]
    best = f"{max(held):.0f} msg/s" if held else "none of the rates tried"
    lines += ["", f"Highest rate held (every request answered, every {unit}'s p99 < {p99_ms:.0f} ms): **{best}**."]
    return "\n".join(lines)


def table(r: BrokerResult, rate: float, every: float) -> str:
    unit = window_name(every)
    lines = [f"| {unit} | bare p50 / p95 / p99 ms | pipeline p50 / p95 / p99 ms | added p99 ms | "
             "broker CPU % (bare / pipeline) | broker RSS MiB (bare / pipeline) |",
             "|---:|---|---|---:|---|---|"]
    for m in sorted(r.pipe.by_minute):
        b, p = r.bare.p(m), r.pipe.p(m)
        bc = r.bare_broker[m] if m < len(r.bare_broker) else (float("nan"), float("nan"))
        pc = r.pipe_broker[m] if m < len(r.pipe_broker) else (float("nan"), float("nan"))
        lines.append(f"| {m + 1} | {b[0]:.1f} / {b[1]:.1f} / {b[2]:.1f} | {p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f} | "
                     f"{p[2] - b[2]:.1f} | {bc[0]:.0f} / {pc[0]:.0f} | {bc[1]:.0f} / {pc[1]:.0f} |")
    worst = max((r.pipe.p(m)[2] - r.bare.p(m)[2] for m in r.pipe.by_minute), default=float("nan"))
    lines += ["", f"Answered: bare {r.bare.answered:,}/{r.bare.sent:,}, pipeline {r.pipe.answered:,}/{r.pipe.sent:,}. "
              f"Worst added p99 in a {unit}: {worst:.1f} ms (target < 50 ms at {rate:.0f} msg/s)."]
    if r.backlog:
        took, got = r.backlog
        lines.append(f"Catch-up: a consumer {got:,} 1-KiB records behind read them in {took:.1f} s.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=None, help="length of each run (10; quick 1)")
    ap.add_argument("--rate", type=float, default=1000.0, help="offered load, msg/s (1000)")
    ap.add_argument("--brokers", default="noida,tansu", help="embedded brokers, in order (noida,tansu)")
    ap.add_argument("--backlog", type=int, default=None, help="catch-up row: records behind (300,000; quick 20,000)")
    ap.add_argument("--light-workers", type=int, default=1, help="light worker processes (1, as tierflow up runs)")
    ap.add_argument("--packaged-rates", default="",
                    help="then the packaged models at these rates (msg/s, comma-separated) on the first broker")
    ap.add_argument("--packaged-p99", type=float, default=250.0, help="p99 a packaged rate must hold (ms)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--section", default="Sustained load per embedded broker",
                    help="the BENCHMARKS.md section --write replaces (a run of one broker can keep its own)")
    args = ap.parse_args()
    minutes = args.minutes or (1.0 if args.quick else 10.0)
    backlog = args.backlog if args.backlog is not None else (20_000 if args.quick else 300_000)
    every = window_s(minutes)
    parts = []
    for broker in args.brokers.split(","):
        print(f"== {broker}: bare broker, then the pipeline, {minutes:g} min each at {args.rate:.0f} msg/s", flush=True)
        r = run_broker(broker, minutes, args.rate, backlog if broker == "noida" else 0, args.light_workers)
        part = f"**{broker}**\n\n" + table(r, args.rate, every)
        print(part, flush=True)
        parts.append(part)
    rates = [float(r) for r in args.packaged_rates.split(",") if r.strip()]
    if rates:
        broker = args.brokers.split(",")[0]
        swept = packaged_sweep(broker, rates, minutes, args.packaged_p99, args.light_workers)
        part = (f"**{broker}, packaged models** (the pack's classifiers in every tier, on the threads `tierflow up` "
                f"gives them; the heavy tier's writer off: bench.generation times it), {minutes:g} min at each "
                "rate, lowest first, stopping at the first rate not held\n\n"
                + sweep_table(swept, args.packaged_p99, every))
        print(part, flush=True)
        parts.append(part)
    workers = "one light worker" if args.light_workers == 1 else f"{args.light_workers} light workers"
    body = (f"{args.rate:.0f} msg/s for {minutes:g} minutes, first on the bare broker (produce to a topic, consume "
            f"it back), then through the whole pipeline (ingest, {workers}, "
            "heavy and multimodal; echo models; request to answer read), each on fresh topics of the same broker; "
            "the producer and the "
            "reader run in the benchmark process on the same 2 cores. Latency is bucketed by the minute a request "
            "was sent; the broker's CPU and RSS are read from /proc at the end of each minute. noida runs with the "
            "embedded stack's topic bounds (pipeline/adapters/brokers.py); tansu has none.\n\n"
            + "\n\n".join(parts)
            + f"\n\n1-minute load average at the end: {os.getloadavg()[0]:.1f}.\n")
    if args.write:
        write_section(args.section, body)


if __name__ == "__main__":
    main()

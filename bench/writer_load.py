"""The heavy tier's writer under load: a fresh `tierflow up` as a user starts it takes `--rate` msg/s of the shop's
traffic for `--seconds`, once with default settings (the packaged writer on where `make demo` installed it) and once
with the writer off (`TIERFLOW_HEAVY_GENERATOR=none`), in turn, in one run.

Every message must be answered. Reported per configuration: answers by tier and how many were degraded (ingest's
health check sent a heavy-bound message to light), latency (sent to answer read) per tier, what each heavy answer
was (written, or the template and why), and `tierflow status --once`'s writer line as the operator sees it.

    python -m bench.writer_load [--rate 50] [--seconds 60] [--configs writer,none] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.article_service import IntentReader, shop_messages
from bench.common import run_ids, tierflow_up, write_section
from bench.pipeline import percentiles, send
from pipeline.adapters.kafka import topics_of
from pipeline.settings import Settings

CONFIGS: dict[str, dict[str, str]] = {"writer": {}, "none": {"TIERFLOW_HEAVY_GENERATOR": "none"}}
LABELS = {"writer": "default (writer on)", "none": "writer off (`TIERFLOW_HEAVY_GENERATOR=none`)"}


@dataclass
class Run:
    config: str
    n: int
    ready_s: float
    banner: str
    latency_ms: dict[str, float]  # request id -> sent to read
    answers: Mapping[str, Mapping[str, Any]]
    status: list[str]  # the status view's writer line(s)


def measure(config: str, rate: float, seconds: float, wait_s: float) -> Run:
    cases = shop_messages()
    n = int(rate * seconds)
    with tierflow_up("writer-load", CONFIGS[config]) as up:
        banner = next((line.strip() for line in up.banner if line.strip().startswith("writer")), "writer ?")
        s = Settings(kafka_port=int(up.env["TIERFLOW_KAFKA_PORT"]), redis_port=int(up.env["TIERFLOW_REDIS_PORT"]),
                     data_dir=up.env["TIERFLOW_DATA_DIR"])
        ids = run_ids(n)
        reader = IntentReader(s, topics_of(s).answers, ids)
        reader.start()
        print(f"{config}: up in {up.ready_s:.0f} s ({banner}); sending {n} at {rate:g} msg/s", flush=True)
        sent_at = send(s, topics_of(s).requests, ids, rate, texts=[cases[i % len(cases)].text for i in range(n)])
        reader.wait(wait_s)
        reader.stop()
        status = subprocess.run([sys.executable, "-m", "pipeline.cli", "status", "--once"], env=up.env,
                                capture_output=True, text=True, timeout=120).stdout
    read_at = reader.log.read_at
    return Run(config, n, up.ready_s, " ".join(banner.split()),
               {rid: (read_at[rid] - t) * 1000 for rid, t in sent_at.items() if rid in read_at}, reader.answers,
               [" ".join(x.split()) for x in status.splitlines() if x.strip().startswith("writer")])


def report(runs: list[Run], rate: float, seconds: float) -> str:
    lines = [f"`python -m bench.writer_load --rate {rate:g} --seconds {seconds:g}`: a fresh `tierflow up` per "
             f"configuration, in turn, takes {rate:g} msg/s of the shop pack's check and held-out messages (English "
             f"and Chinese, in turn) for {seconds:g} s; 2 cores, the sender and the reader in the benchmark process "
             "beside it. Latency: sent to answer read.", "",
             "| configuration | answered | degraded | heavy answers | heavy p50 / p95 / p99 ms | "
             "light p50 / p95 / p99 ms | heavy answers written / template (why) |",
             "|---|---:|---:|---:|---|---|---|"]
    for r in runs:
        tiers: dict[str, list[float]] = {}
        for rid, a in r.answers.items():
            if rid in r.latency_ms:
                tiers.setdefault(str(a.get("tier")), []).append(r.latency_ms[rid])
        heavy = [a for a in r.answers.values() if a.get("tier") == "heavy"]
        written = [a for a in heavy if a["timings_ms"].get("write") and not a.get("fallback")]
        reasons = Counter(str(a.get("fallback_reason")) for a in heavy if a.get("fallback"))
        degraded = sum(bool(a.get("degraded")) for a in r.answers.values())

        heavy_p, light_p = (" / ".join(f"{x:.0f}" for x in percentiles(tiers.get(t, []))) for t in ("heavy", "light"))
        why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none"
        lines.append(f"| {LABELS[r.config]} | {len(r.answers)}/{r.n} | {degraded} | {len(heavy)} | {heavy_p} | "
                     f"{light_p} | {len(written)} / {sum(reasons.values())} ({why}) |")
    lines.append("")
    for r in runs:
        writes = [float(a["timings_ms"]["write"]) for a in r.answers.values() if a["timings_ms"].get("write")]
        took = f"; writer's time on a batch, median {statistics.median(writes):.0f} ms" if writes else ""
        lines.append(f"- {LABELS[r.config]}: up in {r.ready_s:.0f} s (`{r.banner}`){took}; `tierflow status "
                     f"--once` afterwards: " + (" / ".join(f"`{x}`" for x in r.status) or "no writer line") + ".")
    lines.append(f"\n1-minute load average at the end: {os.getloadavg()[0]:.1f}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50.0, help="offered load, msg/s (50)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long it is offered (60)")
    ap.add_argument("--wait", type=float, default=120.0, help="how long after the last send to wait for answers")
    ap.add_argument("--configs", default="writer,none", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args()
    runs = []
    for config in args.configs.split(","):
        if config not in CONFIGS:
            raise SystemExit(f"--configs: {config!r} is not one of {', '.join(CONFIGS)}")
        runs.append(measure(config, args.rate, args.seconds, args.wait))
    body = report(runs, args.rate, args.seconds)
    print(body)
    if args.write:
        write_section("The writer under load", body)


if __name__ == "__main__":
    main()

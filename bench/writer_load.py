"""The heavy tier's writer under load: a fresh `tierflow up` as a user starts it (default settings: the packaged
writer on where `make demo` installed it) takes `--rate` msg/s of the shop's traffic for `--seconds`.

Every message must be answered. Reported: answers by tier and how many were degraded (ingest's health check sent a
heavy-bound message to light), what each heavy answer was (written, or the template and why), latency (sent to
answer read) per tier, and `tierflow status --once`'s writer line as the operator sees it.

    python -m bench.writer_load [--rate 50] [--seconds 60] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from bench.article_service import IntentReader, shop_messages
from bench.common import run_ids, tierflow_up, write_section
from bench.pipeline import percentiles, send
from pipeline.adapters.kafka import topics_of
from pipeline.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50.0, help="offered load, msg/s (50)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long it is offered (60)")
    ap.add_argument("--wait", type=float, default=120.0, help="how long after the last send to wait for answers")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args()
    cases = shop_messages()
    n = int(args.rate * args.seconds)
    with tierflow_up("writer-load") as up:
        banner = next((line.strip() for line in up.banner if line.strip().startswith("writer")), "writer: ?")
        s = Settings(kafka_port=int(up.env["TIERFLOW_KAFKA_PORT"]), redis_port=int(up.env["TIERFLOW_REDIS_PORT"]),
                     data_dir=up.env["TIERFLOW_DATA_DIR"])
        ids = run_ids(n)
        reader = IntentReader(s, topics_of(s).answers, ids)
        reader.start()
        print(f"up in {up.ready_s:.0f} s ({banner}); sending {n} at {args.rate:g} msg/s", flush=True)
        sent_at = send(s, topics_of(s).requests, ids, args.rate, texts=[cases[i % len(cases)].text for i in range(n)])
        reader.wait(args.wait)
        reader.stop()
        status = subprocess.run([sys.executable, "-m", "pipeline.cli", "status", "--once"], env=up.env,
                                capture_output=True, text=True, timeout=120).stdout
    answers = reader.answers
    lines = [line.strip() for line in status.splitlines() if "written" in line or "templates instead" in line]
    body = report(args, n, sent_at, reader.log.read_at, answers, up.ready_s, banner, lines)
    print(body)
    if args.write:
        write_section("The writer under load", body)


def report(args: argparse.Namespace, n: int, sent_at: dict[str, float], read_at: dict[str, float],
           answers: Mapping[str, Mapping[str, Any]], ready_s: float, banner: str, status: list[str]) -> str:
    tiers = Counter(str(a.get("tier")) for a in answers.values())
    degraded = Counter(str(a.get("route_reason")) for a in answers.values() if a.get("degraded"))
    heavy = [a for a in answers.values() if a.get("tier") == "heavy"]
    written = [a for a in heavy if a["timings_ms"].get("write") and not a.get("fallback")]
    reasons = Counter(str(a.get("fallback_reason")) for a in heavy if a.get("fallback"))
    rows = []
    for tier in sorted(tiers):
        lat = [(read_at[rid] - sent_at[rid]) * 1000 for rid, a in answers.items()
               if a.get("tier") == tier and rid in read_at]
        p50, p95, p99 = percentiles(lat)
        rows.append(f"| {tier} | {tiers[tier]} | {p50:.0f} | {p95:.0f} | {p99:.0f} |")
    writes = [float(a["timings_ms"]["write"]) for a in written]
    parts = [
        f"`python -m bench.writer_load --rate {args.rate:g} --seconds {args.seconds:g}`: a fresh `tierflow up` "
        f"(default settings; {banner}; up in {ready_s:.0f} s) takes {args.rate:g} msg/s of the shop pack's check "
        f"and held-out messages (English and Chinese, in turn) for {args.seconds:g} s; 2 cores, the sender in the "
        "benchmark process beside it.",
        "",
        f"Answered: **{len(answers)}/{n}**. Degraded to light by ingest's health check: {sum(degraded.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(degraded.items()))})" if degraded else "") + ".",
        "",
        "| tier | answers | p50 ms (sent to read) | p95 | p99 |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Heavy answers: {len(heavy)}; written and sent {len(written)}"
        + (f" (writer's time each: median {statistics.median(writes) / 1000:.1f} s)" if writes else "")
        + "; the template instead: " + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none") + ".",
        "",
        "`tierflow status --once` afterwards: " + (" / ".join(f"`{x}`" for x in status) or "(no writer line)") + ".",
        f"1-minute load average at the end: {os.getloadavg()[0]:.1f}.",
    ]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"({time.monotonic() - t0:.0f} s)")

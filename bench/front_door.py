"""The front door as a user meets it: a fresh `tierflow up`, then `tierflow send TEXT --wait` again and again from
another shell, then `tierflow answers` and `tierflow status --once` a few times each.

Each command is a new `tierflow` process (interpreter start included), so its wall time is what a user waits.

    python -m bench.front_door [--sends 100] [--reads 10] [--broker noida] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.common import tierflow_up, write_section
from bench.soak import ECHO

TEXTS = ["where is my order?", "我的订单什么时候到？",
         "I want to return the shoes I bought last week, they are too small",
         "can I change the delivery address of my order please"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sends", type=int, default=100)
    ap.add_argument("--reads", type=int, default=10, help="runs each of `tierflow answers` and `status --once`")
    ap.add_argument("--broker", default="noida")
    ap.add_argument("--models", choices=["packaged", "echo"], default="packaged",
                    help="the packaged models (what `tierflow up` runs) or echo (the pipeline alone)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    extra = {"TIERFLOW_EMBEDDED_BROKER": args.broker, **(ECHO if args.models == "echo" else {})}
    walls, totals, tiers, failed = [], [], [], 0
    by_kind: dict[str, list[float]] = {}  # the answer's total by tier, and whether the writer wrote it
    reads: dict[str, list[float]] = {"answers": [], "status --once": []}
    printed = reads_failed = 0
    with tierflow_up("front", extra) as up:
        env, ready_s = up.env, up.ready_s
        for i in range(args.sends):
            t = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "pipeline.cli", "send", TEXTS[i % len(TEXTS)], "--wait",
                                  "--timeout", "30"], env=env, capture_output=True, text=True)
            walls.append(time.monotonic() - t)
            if out.returncode != 0:
                failed += 1
                print(f"send {i}: exit {out.returncode}: {out.stderr.strip()[-300:]}", flush=True)
                continue
            ans = json.loads(out.stdout[out.stdout.index("{"):])
            totals.append(ans["timings_ms"]["total"])
            tiers.append(ans["tier"])
            written = " (written by the writer)" if "write" in ans["timings_ms"] else ""
            by_kind.setdefault(f"{ans['tier']}{written}", []).append(ans["timings_ms"]["total"])
        for _ in range(args.reads):
            t = time.monotonic()
            listed = subprocess.run([sys.executable, "-m", "pipeline.cli", "answers", "--json"], env=env,
                                    capture_output=True, text=True, timeout=120)
            reads["answers"].append(time.monotonic() - t)
            printed = len([ln for ln in listed.stdout.splitlines() if ln.startswith("{")])
            t = time.monotonic()
            shown = subprocess.run([sys.executable, "-m", "pipeline.cli", "status", "--once"], env=env,
                                   capture_output=True, text=True, timeout=120)
            reads["status --once"].append(time.monotonic() - t)
            if listed.returncode != 0 or shown.returncode != 0 or "tierflow status" not in shown.stdout:
                reads_failed += 1
                print(f"answers exit {listed.returncode}, status exit {shown.returncode}: "
                      f"{(listed.stderr + shown.stderr).strip()[-300:]}", flush=True)
    med, worst = statistics.median(walls), max(walls)
    pyc = " Python's bytecode cache off (PYTHONDONTWRITEBYTECODE): tierflow's modules compiled at every start." \
        if os.environ.get("PYTHONDONTWRITEBYTECODE") else ""
    body = (f"A fresh `tierflow up` (embedded {args.broker}, {args.models} models; ready in {ready_s:.1f} s), then "
            f"{args.sends} sequential `tierflow send TEXT --wait` as new processes, then `tierflow answers` and "
            f"`tierflow status --once` {args.reads} times each.\n\n"
            "| | median | max |\n|---|---:|---:|\n"
            f"| `send --wait`, wall time per command (interpreter start included) | {med:.2f} s | {worst:.2f} s |\n"
            + "".join(f"| `{name}`, wall time per command | {statistics.median(ts):.2f} s | {max(ts):.2f} s |\n"
                      for name, ts in reads.items() if ts)
            + f"| the answer's own total (ingest to answer) | {statistics.median(totals):.0f} ms | "
            f"{max(totals):.0f} ms |\n"
            + "".join(f"| the answer's own total, {kind}: {len(ts)} | {statistics.median(ts):.0f} ms | "
                      f"{max(ts):.0f} ms |\n" for kind, ts in sorted(by_kind.items()))
            + "\n"
            f"Answers printed by `send --wait`: {len(totals)} of {args.sends} ({failed} failed); tiers: "
            + ", ".join(f"{t} {tiers.count(t)}" for t in sorted(set(tiers)))
            + f". `tierflow answers` printed {printed}"
            + (f"; {reads_failed} of {args.reads} answers/status runs failed" if reads_failed else "")
            + f". 1-minute load average: {os.getloadavg()[0]:.1f}.{pyc}\n")
    print(body)
    if args.write:
        write_section(f"The front door ({args.broker}, {args.models} models)", body)
    if failed or reads_failed or (args.reads and printed < args.sends):
        sys.exit(1)


if __name__ == "__main__":
    main()

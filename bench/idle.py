"""What an idle `tierflow up` costs: the whole process tree's CPU (broker, Redis, every agent), sampled with psutil
once the stack has been up a while with no traffic; then what a lone message waits (`send --wait`'s own total).

Each configuration is a fresh `tierflow up` with default settings on free ports, in turn, in one run: the default
(idle consumers rest, pipeline/core/fetch_pacing.py) and `TIERFLOW_KAFKA_FETCH_PACING=off` (every librdkafka
consumer fetching in a loop from a broker that answers at once: what tierflow did before).

    python -m bench.idle [--settle 60] [--window 30] [--sends 10] [--configs default,off] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.common import tierflow_up, write_section

# no-writer: the stack without the heavy tier's writer loaded (its 1.5B weights take ~30 s of CPU to load and warm);
# what the tests' tiny run measures, since the writer's start is the demo's and test_llama's to pay.
CONFIGS: dict[str, dict[str, str]] = {"default": {}, "off": {"TIERFLOW_KAFKA_FETCH_PACING": "off"},
                                      "no-writer": {"TIERFLOW_HEAVY_GENERATOR": "none"}}
LABELS = {"default": "default (idle consumers rest)", "off": "`TIERFLOW_KAFKA_FETCH_PACING=off`",
          "no-writer": "`TIERFLOW_HEAVY_GENERATOR=none` (no writer loaded)"}


@dataclass
class Idle:
    ready_s: float
    total_pct: float  # of one core, the whole tree
    by_process: dict[str, float]
    totals_ms: list[float]
    failed: int


def cpu_s(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        return 0.0


def name_of(p: psutil.Process) -> str:
    """broker, redis, or the agent's name (`worker-light`, ...), from its command line."""
    try:
        argv = p.cmdline()
    except psutil.Error:
        return "?"
    joined = " ".join(argv)
    if "pipeline.cli" in joined:
        args = argv[argv.index("pipeline.cli") + 1:] if "pipeline.cli" in argv else argv[-3:]
        if args[:1] == ["worker"] and "--tier" in args:
            return f"worker-{args[args.index('--tier') + 1]}"
        return args[0] if args else "?"
    if "noida" in joined or "tansu" in joined:
        return "broker"
    if "valkey" in joined or "redis" in joined:
        return "redis"
    return Path(argv[0]).name if argv else "?"


def measure(extra_env: dict[str, str], settle_s: float, window_s: float, sends: int) -> Idle:
    with tierflow_up("idle", extra_env) as up:
        env, ready_s = up.env, up.ready_s
        time.sleep(settle_s)
        root = psutil.Process(up.proc.pid)
        procs = [root, *root.children(recursive=True)]
        before = {p.pid: cpu_s(p) for p in procs}
        time.sleep(window_s)
        used = {p.pid: cpu_s(p) - before[p.pid] for p in procs}
        by_name: dict[str, float] = {}
        for p in procs:
            by_name[name_of(p)] = by_name.get(name_of(p), 0.0) + used[p.pid] / window_s * 100.0
        # children_* of the root count its exited children only; live ones are counted once, by themselves
        total = sum(used.values()) / window_s * 100.0
        totals, failed = [], 0
        for i in range(sends):
            time.sleep(2.0)  # every send finds the stack at rest again
            out = subprocess.run([sys.executable, "-m", "pipeline.cli", "send", "where is my order?", "--wait",
                                  "--timeout", "30", "--id", f"idle-{i}-{uuid.uuid4().hex[:6]}"],
                                 env=env, capture_output=True, text=True)
            if out.returncode != 0:
                failed += 1
                print(f"send {i}: exit {out.returncode}: {out.stderr.strip()[-300:]}", flush=True)
                continue
            totals.append(float(json.loads(out.stdout[out.stdout.index("{"):])["timings_ms"]["total"]))
    return Idle(ready_s, total, by_name, totals, failed)


def report(results: dict[str, Idle], settle_s: float, window_s: float, cores: int) -> str:
    names = sorted({n for r in results.values() for n in r.by_process if r.by_process[n] >= 0.05},
                   key=lambda n: (n != "broker", n != "redis", n))
    head = "| configuration | whole stack | " + " | ".join(names) + " | `send --wait` total, median (max) |\n"
    head += "|---|---:|" + "---:|" * len(names) + "---:|\n"
    rows = []
    for cfg, r in results.items():
        cells = " | ".join(f"{r.by_process.get(n, 0.0):.1f}%" for n in names)
        lat = (f"{statistics.median(r.totals_ms):.0f} ms ({max(r.totals_ms):.0f} ms)" if r.totals_ms else "-")
        if r.failed:
            lat += f", {r.failed} failed"
        rows.append(f"| {LABELS.get(cfg, cfg)} | **{r.total_pct:.1f}%** | {cells} | {lat} |")
    first = next(iter(results.values()))
    ratio = ""
    if "default" in results and "off" in results and results["default"].total_pct > 0:
        cut = results["off"].total_pct / results["default"].total_pct
        ratio = f"Resting consumers cut the idle stack's CPU {cut:.0f}x in this run."
    return (f"A fresh `tierflow up` per configuration (embedded noida, the packaged models, ready in "
            f"{first.ready_s:.0f} s), left alone {settle_s:.0f} s, then the CPU time of its whole process tree over "
            f"{window_s:.0f} s (psutil), as % of one core ({cores} cores here); then `tierflow send ... --wait` with "
            "2 s of quiet before each, and the answer's own `total` (request written to answer written).\n\n"
            + head + "\n".join(rows) + "\n\n" + ratio.strip() + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settle", type=float, default=60.0, help="seconds idle after 'tierflow is up' before sampling")
    ap.add_argument("--window", type=float, default=30.0, help="seconds sampled")
    ap.add_argument("--sends", type=int, default=10)
    ap.add_argument("--configs", default="default,off", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    results: dict[str, Idle] = {}
    for cfg in args.configs.split(","):
        if cfg not in CONFIGS:
            raise SystemExit(f"--configs: {cfg!r} is not one of {', '.join(CONFIGS)}")
        results[cfg] = measure(CONFIGS[cfg], args.settle, args.window, args.sends)
        print(f"{cfg}: {results[cfg].total_pct:.1f}% of a core", flush=True)
    body = report(results, args.settle, args.window, os.cpu_count() or 1)
    print(body)
    if args.write:
        write_section("An idle stack", body)


if __name__ == "__main__":
    main()

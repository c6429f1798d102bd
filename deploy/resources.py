"""Measure what each tierflow process uses and print the k8s requests and limits that follow from it.

    tierflow up &                                       # or any stack of tierflow processes on this machine
    python deploy/traffic.py --rate 12 --seconds 150 &  # live traffic (or your own), while it measures
    python deploy/resources.py --seconds 120            # samples every process's RSS and CPU from /proc

Per role (ingest, light, heavy, multimodal, feedback, trainer: found by their command lines), it takes the peak RSS
and the mean and p95 CPU (cores) over the run. The trainer's retraining child (`python -m workers.training.online`)
runs in the trainer's pod, so the trainer's numbers are the two processes' sums at each sample. The suggestion:
memory request = peak x 1.5 (the models' arenas grow with the batch), limit = 2x the request; CPU request = the p95
(at least 50m), no CPU limit (throttling a latency-bound worker costs more than it saves). GPU limits stay as
the manifests have them. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROLES = {"ingest": ("pipeline.cli", "ingest"), "light": ("--tier", "light"), "heavy": ("--tier", "heavy"),
         "multimodal": ("--tier", "multimodal"), "feedback": ("pipeline.cli", "feedback"),
         "trainer": ("pipeline.cli", "learn")}
POD_SUMMED = {"trainer"}  # processes that share one pod (the trainer, its retraining child): RSS and CPU add up
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MI = 1024 * 1024


def role_of(cmdline: list[str]) -> str | None:
    """The tierflow role a process runs, from its command line (`tierflow worker --tier heavy`, ...)."""
    joined = " ".join(cmdline)
    if "workers.training.online" in cmdline:
        return "trainer"  # the trainer's retraining child
    if "pipeline.cli" not in joined and not any(Path(c).name == "tierflow" for c in cmdline[:2]):
        return None
    if "worker" in cmdline:
        return next((t for t in ("light", "heavy", "multimodal") if t in cmdline), None)
    if "learn" in cmdline:
        return "trainer"
    return next((r for r in ("ingest", "feedback") if r in cmdline), None)


@dataclass
class Usage:
    rss_peak: int = 0
    cpu: list[float] = field(default_factory=list)  # cores, per sample interval


def read(pid: int) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        statm = Path(f"/proc/{pid}/statm").read_text().split()
    except (OSError, IndexError):
        return None
    return int(statm[1]) * PAGE, (int(stat[11]) + int(stat[12])) / TICK


def processes() -> dict[int, str]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            role = role_of([c for c in cmd if c])
            if role is not None:
                out[int(d.name)] = role
    return out


def measure(seconds: float, every: float) -> dict[str, Usage]:
    usage: dict[str, Usage] = {}
    last: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, at)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = time.monotonic()
        summed: dict[str, tuple[int, float]] = {}  # POD_SUMMED role -> (RSS, cores) of this sample
        for pid, role in processes().items():
            got = read(pid)
            if got is None:
                continue
            rss, cpu = got
            u = usage.setdefault(role, Usage())
            cores = None
            if pid in last:
                cpu0, at0 = last[pid]
                cores = (cpu - cpu0) / max(1e-6, now - at0)
            last[pid] = (cpu, now)
            if role in POD_SUMMED:
                rss0, cores0 = summed.get(role, (0, 0.0))
                summed[role] = (rss0 + rss, cores0 + (cores or 0.0))
                continue
            u.rss_peak = max(u.rss_peak, rss)
            if cores is not None:
                u.cpu.append(cores)
        for role, (rss, cores) in summed.items():
            usage[role].rss_peak = max(usage[role].rss_peak, rss)
            usage[role].cpu.append(cores)
        time.sleep(every)
    return usage


def mebi(n: float) -> str:
    return f"{max(64, math.ceil(n / MI / 64) * 64)}Mi"


def millicores(cores: float) -> str:
    return f"{max(50, math.ceil(cores * 1000 / 50) * 50)}m"


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.95 * len(s)))] if s else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to sample (60)")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples (0.5)")
    args = ap.parse_args(argv)
    if not Path("/proc/self/stat").exists():
        sys.exit("deploy/resources.py: needs Linux /proc")
    usage = measure(args.seconds, args.every)
    if not usage:
        sys.exit("deploy/resources.py: no tierflow process found (start `tierflow up` first)")
    print(f"measured {args.seconds:.0f} s, every {args.every} s\n")
    print(f"{'role':<11}{'peak RSS':>10}{'mean CPU':>10}{'p95 CPU':>10}   suggested resources")
    for role in ROLES:
        u = usage.get(role)
        if u is None:
            print(f"{role:<11}{'-':>10}{'-':>10}{'-':>10}   (not running)")
            continue
        mean = sum(u.cpu) / len(u.cpu) if u.cpu else 0.0
        req_mem = u.rss_peak * 1.5
        print(f"{role:<11}{u.rss_peak / MI:>8.0f}Mi{mean:>10.2f}{p95(u.cpu):>10.2f}   "
              f"requests: {{cpu: {millicores(p95(u.cpu))}, memory: {mebi(req_mem)}}}  "
              f"limits: {{memory: {mebi(2 * req_mem)}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

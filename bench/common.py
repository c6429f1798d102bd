"""Shared benchmark plumbing: machine description and BENCHMARKS.md section writing."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import shlex
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from pipeline.adapters.kafka import create_topics
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"


def machine() -> str:
    """Cores, CPU model, memory and GPU (if any), in one line."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.findall(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[0])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, IndexError):
        pass
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} cores ({cpu}){mem}, {gpu}, Python {platform.python_version()}"


def command() -> str:
    """The command line that is running, as a user would type it."""
    prog = Path(sys.argv[0])
    argv = sys.argv[1:]
    main_mod = sys.modules.get("__main__")
    spec = getattr(main_mod, "__spec__", None)
    if spec is not None and spec.name:  # run as `python -m bench.x`
        return shlex.join(["python", "-m", spec.name, *argv])
    if prog.suffix == ".py":
        return shlex.join(["python", str(prog.relative_to(ROOT) if prog.is_absolute() and ROOT in prog.parents
                                         else prog), *argv])
    return shlex.join([prog.name, *argv])


def recorded(title: str, row: str, column: int, path: Path = BENCHMARKS) -> float | None:
    """A number another benchmark wrote: `column` (0 = first cell) of the table row starting `| row` in
    section `## title` of BENCHMARKS.md; None when that section or row is not there."""
    if not path.exists():
        return None
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", path.read_text(), re.S | re.M)
    for line in (m.group(1).splitlines() if m else []):
        if line.startswith(f"| {row}"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            try:
                return float(cells[column].replace(",", "").split()[0])
            except (IndexError, ValueError):
                return None
    return None


def write_section(title: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace (or append) the `## title` section of BENCHMARKS.md with `body` plus provenance."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"## {title}\n\n"
               f"Command: `{command()}`  \nMachine: {machine()} (host {socket.gethostname()})  \nDate: {stamp}\n\n"
               f"{body.strip()}\n")
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEvery section is written by the command it names.\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    found = pattern.search(text)
    text = pattern.sub(lambda _: section + "\n", text) if found else text.rstrip() + "\n\n" + section
    path.write_text(text.rstrip() + "\n")


@contextlib.contextmanager
def embedded_services() -> Iterator[Settings]:
    """A broker and a Redis of the benchmark's own, on free ports; yields settings that dial them."""
    base = Settings(kafka_port=free_port(), redis_port=free_port(), data_dir=Path(".tierflow/bench"))
    stack = Stack(base)
    stack.start_services()
    try:
        yield stack.settings.updated(kafka_bootstrap=base.kafka.servers, redis_url=base.redis.address)
    finally:
        stack.stop()


def fresh_topics(base: Settings) -> Settings:
    """`base` with new uuid-named topics (created) and Redis keys: each round starts empty."""
    tag = uuid.uuid4().hex[:6]
    s = base.updated(topic_prefix=f"b{tag}.", redis_prefix=f"b{tag}:")
    create_topics(s)
    return s

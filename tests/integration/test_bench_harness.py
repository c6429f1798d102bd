"""Every benchmark in bench/ runs end to end on a tiny sample, so the harness behind BENCHMARKS.md cannot rot.

Real broker, Redis, processes and models, as in the full runs; only the sizes shrink. Without --write
nothing in the repository changes (BENCHMARKS.md and the committed plot are compared byte for byte).
bench/quality's --quick path has its own test (tests/unit/test_quality_bench.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "ingest": (["--messages", "3000", "--rounds", "1", "--codecs", "lz4"], "| lz4 (default) |"),
    # quix needs a virtualenv of its own (made with pip on first use): test_bench_peers runs both peers
    "peers": (["--messages", "2000", "--rounds", "1", "--only", "tierflow,faust"], "faust: median"),
    "batching": (["--messages", "64", "--rounds", "1"], "| one at a time: msg/s | batched: msg/s |"),
    "feedback": (["--results", "3000", "--rounds", "1"], "| feedback agent, end to end |"),
    "idle": (["--settle", "1", "--window", "2", "--sends", "1", "--configs", "no-writer"], "| whole stack |"),
    "pipeline": (["--flat", "600", "--seconds", "1"], "| pipeline, echo model | flat out |"),
    "article_service": (["--messages", "20", "--seconds", "1", "--rate", "20"], "Throughput ratio"),
    "sustained": (["--minutes", "0.1", "--rate", "100", "--backlog", "2000", "--packaged-rates", "20",
                   "--brokers", os.environ.get("TIERFLOW_EMBEDDED_BROKER", "noida")],
                  ("Worst added p99", "Highest rate held")),
    "front_door": (["--sends", "3", "--reads", "1", "--models", "echo",
                    "--broker", os.environ.get("TIERFLOW_EMBEDDED_BROKER", "noida")],
                   ("`send --wait`, wall time per command", "the answer's own total, light")),
    "durability": (["--seconds", "2", "--rate", "200",
                    "--brokers", os.environ.get("TIERFLOW_EMBEDDED_BROKER", "noida")], "| consumer offsets kept |"),
}


# The benchmarks that take their broker as an argument and publish a section per broker. The others measure the
# default broker's stack, and their code is the same whichever broker runs under it: the tansu pass skips them.
PER_BROKER = {"sustained", "front_door", "durability"}


@pytest.mark.parametrize("name", sorted(TINY))
def test_benchmark_runs_on_a_tiny_sample(name: str) -> None:
    if name not in PER_BROKER and Settings().embedded.broker != "noida":
        pytest.skip(f"bench.{name} publishes the default broker's numbers (noida); it runs in the noida pass")
    args, expected = TINY[name]
    before = [(ROOT / f).read_bytes() for f in ("BENCHMARKS.md", "bench/quality.png")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    for part in (expected,) if isinstance(expected, str) else expected:
        assert part in run.stdout, run.stdout[-3000:]
    assert [(ROOT / f).read_bytes() for f in ("BENCHMARKS.md", "bench/quality.png")] == before

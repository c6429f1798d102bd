"""Gauges only their owner exports: a process that never sets `tierflow_heavy_healthy` must not export it at 0,
or `min(tierflow_heavy_healthy) == 0` (TierflowHeavyDegraded) fires on a healthy stack."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import REGISTRY, generate_latest

from pipeline import metrics
from tests.unit.test_deploy import ROOT

OWNED = [v for v in vars(metrics).values() if isinstance(v, metrics.OwnedGauge)]


def test_importing_every_agent_and_the_worker_exports_no_owned_gauge() -> None:
    """What a worker, ingest or the feedback agent exports before it sets them (a fresh interpreter: nothing
    here has set them yet)."""
    code = ("import pipeline.agents.ingest, pipeline.agents.feedback, workers.runner\n"
            "from prometheus_client import REGISTRY, generate_latest\n"
            "print(generate_latest(REGISTRY).decode())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "tierflow_routed_total" in out  # the module's plain metrics are there
    for g in OWNED:
        assert f"\n{g.name} " not in out and f"# TYPE {g.name} " not in out, f"{g.name} exported by a non-owner"


def test_an_owned_gauge_is_exported_from_its_first_set() -> None:
    g = metrics.OwnedGauge("tierflow_test_owned", "test")
    assert not g.exported and b"tierflow_test_owned" not in generate_latest(REGISTRY)
    g.set(1)
    g.set(0)
    assert g.exported and b"tierflow_test_owned 0.0" in generate_latest(REGISTRY)
    assert [m.name for m in g.describe()] == ["tierflow_test_owned"]


def test_the_owned_gauges_are_the_unlabelled_ones_aggregated_across_processes() -> None:
    assert {g.name for g in OWNED} == {"tierflow_heavy_healthy", "tierflow_heavy_share", "tierflow_handover_share",
                                       "tierflow_threshold_version", "tierflow_thresholds_stale"}

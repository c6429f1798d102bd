"""Fixtures of the fault suite: a recorder of what each fault test measured, for RELIABILITY.md.

Each test calls `reliability.record(...)` with its counts before it asserts, so a failed invariant is
written down too. With TIERFLOW_RELIABILITY_JSON set (tests/faults/run.py sets it) the rows are saved
there at the end of the session; run.py renders them into RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.settings import Settings

# Every fault test accounts for every record it sent, reading the outputs as they come; on a loaded 2-core box a
# reader may lag by seconds. The embedded noida keeps 1 MiB a partition by default, which a run of poison with
# huge keys and headers passes in seconds: records would expire before they are read (measured: 765 of 10,407
# dead letters gone). So fault tests keep more, on every broker that bounds retention.
KEEP_BYTES = 64 * 1024 * 1024


@pytest.fixture
def settings_factory(settings_factory: Callable[..., Settings]) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return settings_factory(**{"topic_retention_bytes": KEEP_BYTES, **overrides})
    return make


@dataclass
class Reliability:
    """Rows of measured faults and invariants, one per test run."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    current: str = ""

    def record(self, fault: str, variant: str, load: str, invariants: dict[str, bool], counts: dict[str, Any],
               peak_rss_mib: dict[str, float] | None = None, notes: str = "") -> None:
        self.rows.append({"test": self.current, "broker": broker_name(), "fault": fault, "variant": variant,
                          "load": load,
                          "invariants": invariants, "counts": counts, "peak_rss_mib": peak_rss_mib or {},
                          "notes": notes, "held": all(invariants.values()), "at": time.time()})


def broker_name() -> str:
    """The broker this run's faults ran on: the embedded one's name, or "kafka" for TIERFLOW_TEST_BOOTSTRAP."""
    if os.environ.get("TIERFLOW_TEST_BOOTSTRAP"):
        return "kafka"
    from pipeline.settings import Settings

    return Settings().embedded.broker


_RELIABILITY = Reliability()
_KNOWN_BUGS: list[dict[str, str]] = []  # strict-xfail tests that failed as expected: open bugs
_SKIPPED: list[dict[str, str]] = []  # tests a broker cannot run (a deviation measured and named in the reason)
# Tests whose docstring says "Regression (found by this suite): ...": bugs found here and fixed since.
REGRESSION = "Regression (found by this suite):"
_REGRESSIONS: dict[str, dict[str, str]] = {}


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Reliability:
    _RELIABILITY.current = request.node.nodeid
    return _RELIABILITY


@pytest.fixture(scope="session", autouse=True)
def _save_reliability() -> Iterator[None]:
    yield
    out = os.environ.get("TIERFLOW_RELIABILITY_JSON")
    if out:
        Path(out).write_text(json.dumps({"rows": _RELIABILITY.rows, "known_bugs": _KNOWN_BUGS, "skipped": _SKIPPED,
                                         "regressions": list(_REGRESSIONS.values())}, indent=1, ensure_ascii=False))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        doc = " ".join((getattr(getattr(item, "function", None), "__doc__", None) or "").split())
        if REGRESSION in doc:
            what = doc.split(REGRESSION, 1)[1].strip()
            _REGRESSIONS[item.nodeid] = {"test": item.nodeid, "bug": what, "outcome": "not run"}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid in _REGRESSIONS and (report.when == "call" or report.failed):
        _REGRESSIONS[report.nodeid]["outcome"] = report.outcome
    if report.when == "call" and report.skipped and hasattr(report, "wasxfail"):
        _KNOWN_BUGS.append({"test": report.nodeid, "broker": broker_name(),
                            "reason": str(report.wasxfail).removeprefix("reason: ")})
    elif report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append({"test": report.nodeid, "broker": broker_name(), "reason": reason.removeprefix("Skipped: ")})


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for row in _RELIABILITY.rows:
        mark = "held" if row["held"] else "BROKEN"
        terminalreporter.write_line(f"reliability: {row['fault']} [{row['variant']}] {mark}: {row['counts']}")

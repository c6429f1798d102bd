"""deploy/resources.py: which process is which role, and the rounding of its suggestions."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

from tests.unit.test_deploy import ROOT

spec = importlib.util.spec_from_file_location("resources", ROOT / "deploy" / "resources.py")
assert spec is not None and spec.loader is not None
resources = importlib.util.module_from_spec(spec)
sys.modules["resources"] = resources  # dataclasses look their module up
spec.loader.exec_module(resources)


def test_roles_from_command_lines() -> None:
    py = sys.executable
    assert resources.role_of([py, "-m", "pipeline.cli", "worker", "--tier", "heavy"]) == "heavy"
    assert resources.role_of(["/opt/venv/bin/tierflow", "worker", "--tier", "light"]) == "light"
    assert resources.role_of([py, "-m", "pipeline.cli", "ingest"]) == "ingest"
    assert resources.role_of(["/opt/venv/bin/tierflow", "feedback"]) == "feedback"
    assert resources.role_of([py, "-m", "pytest", "tests/unit/test_ingest.py"]) is None
    assert resources.role_of([py, "-m", "pipeline.cli", "up"]) is None  # the supervisor is not a pod


def test_suggestions_round_up_with_floors() -> None:
    assert resources.mebi(10 * resources.MI) == "64Mi" and resources.mebi(100 * resources.MI) == "128Mi"
    assert resources.millicores(0.001) == "50m" and resources.millicores(0.26) == "300m"


def test_measures_a_real_process() -> None:
    """A process whose command line looks like a worker's: its RSS and CPU are read from /proc."""
    code = "import sys, time\nx = bytearray(64 << 20)\nt = time.time()\nwhile time.time() - t < 3: pass"
    p = subprocess.Popen([sys.executable, "-c", code, "pipeline.cli", "worker", "--tier", "light"])
    try:
        time.sleep(0.5)
        usage = resources.measure(1.5, 0.25)
    finally:
        p.kill()
        p.wait()
    u = usage["light"]
    assert u.rss_peak >= 64 << 20 and u.cpu and max(u.cpu) > 0.3, (u.rss_peak, u.cpu)
    assert os.path.exists("/proc/self/stat")

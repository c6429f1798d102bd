"""The alert rules under promtool (Prometheus's own checker and rule-test runner), and their runbooks.

promtool ships with Prometheus (`make tools` installs Debian's `prometheus` package where it can); without it the
promtool tests skip and say so. The structure checks below run everywhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_deploy import ROOT

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; `make tools` does it as root)")
    return tool


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r}


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_rule_tests_pass() -> None:
    out = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert set(alerts()) - fires == set(), "alerts with no test that they fire"
    assert set(alerts()) - quiet == set(), "alerts with no test that they stay quiet"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_section() -> None:
    sections = {anchor(m) for m in re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)}
    for name, rule in alerts().items():
        url = rule["annotations"].get("runbook_url", "")
        assert url, f"{name}: no runbook_url"
        page, _, frag = url.partition("#")
        assert page.endswith("docs/runbook.md") and frag in sections, f"{name}: {url}: no such runbook section"


def test_runbook_commands_exist() -> None:
    """Every `tierflow X` the runbook tells an operator to run is a command of the CLI."""
    from pipeline.cli import COMMANDS

    used = set(re.findall(r"`tierflow (\w+)", RUNBOOK.read_text()))
    assert used and used <= set(COMMANDS), used - set(COMMANDS)


def test_rule_tests_read_the_file_that_ships() -> None:
    files = yaml.safe_load(RULE_TESTS.read_text())["rule_files"]
    assert [(RULE_TESTS.parent / f).resolve() for f in files] == [Path(ALERTS).resolve()]

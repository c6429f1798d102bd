"""The dashboard against Grafana's own schema: `@grafana/schema` (the TypeScript types Grafana generates from its
CUE schema), by the TypeScript compiler, so an unknown field, a wrong type or a missing required one fails here
and not in an operator's Grafana.

Needs `node` and `npm`; `npm ci` installs the pinned packages (package-lock.json) once into
tests/clients/grafana/node_modules. Without node/npm, or when the registry cannot be reached, the test skips and
says why.

Prometheus queries (`expr`, `legendFormat`, ...) are a datasource plugin's fields, which the dashboard schema
types as an open `DataQuery`; each target is checked as `DataQuery` plus exactly those fields.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.npm import install_lock
from tests.unit.test_deploy import ROOT

CLIENT = ROOT / "tests" / "clients" / "grafana"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "tierflow.json"
NPM_CI_TIMEOUT_S = 300

PRELUDE = """\
import type { AnnotationQuery, Dashboard, DataQuery } from "@grafana/schema";

// The Prometheus plugin's query fields (public/app/plugins/datasource/prometheus/types.ts), on top of DataQuery.
interface PromQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  interval?: string;
  format?: "time_series" | "table" | "heatmap";
}
// a panel target is an open record in the schema: the query plugin owns its fields
const q = (t: PromQuery): Record<string, unknown> => ({ ...t });
const annotation = (a: AnnotationQuery & { target?: PromQuery }): AnnotationQuery => a;

"""


def tool() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"the Grafana schema check needs Node.js: {'node' if node is None else 'npm'} not on PATH")
    tsc = CLIENT / "node_modules" / "typescript" / "bin" / "tsc"
    with install_lock(CLIENT):
        if not tsc.exists():
            try:
                out = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, capture_output=True, text=True,
                                     timeout=NPM_CI_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                pytest.skip(f"`npm ci` in {CLIENT} took over {NPM_CI_TIMEOUT_S} s (npm registry unreachable?)")
            if out.returncode != 0:
                last = (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
                pytest.skip(f"`npm ci` failed in {CLIENT} (npm registry unreachable?): {last[0]}")
    return node, str(tsc)


def typescript_of(dash: dict[str, Any]) -> str:
    """The dashboard as a TypeScript literal of type Dashboard (the import-only `__inputs`/`__requires` left out:
    they are the import dialog's, not the dashboard model's)."""
    model = {k: v for k, v in dash.items() if not k.startswith("__")}
    calls: dict[str, str] = {}

    def wrapped(fn: str, obj: Any) -> str:  # a placeholder string, replaced by the call below
        token = f"@@{len(calls)}@@"
        calls[token] = f"{fn}({json.dumps(obj, ensure_ascii=False)})"
        return token

    for panel in model.get("panels", []):
        panel["targets"] = [wrapped("q", t) for t in panel.get("targets", [])]
    model["annotations"]["list"] = [wrapped("annotation", a) for a in model["annotations"]["list"]]
    text = json.dumps(model, indent=1, ensure_ascii=False)
    for token, call in calls.items():
        text = text.replace(f'"{token}"', call)
    return PRELUDE + f"export const dashboard: Dashboard = {text};\n"


def test_the_dashboard_type_checks_against_grafana_schema() -> None:
    node, tsc = tool()
    source = CLIENT / "check.gen.ts"
    source.write_text(typescript_of(json.loads(DASHBOARD.read_text())))
    out = subprocess.run([node, tsc, "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "bundler",
                          "--module", "esnext", "--target", "es2022", source.name], cwd=CLIENT, capture_output=True,
                         text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_catches_a_wrong_field() -> None:
    """Not a rubber stamp: a misspelt panel field and a string for a number fail."""
    node, tsc = tool()
    dash = json.loads(DASHBOARD.read_text())
    dash["panels"][1]["gridPos"]["w"] = "6"
    dash["panels"][2]["titel"] = "typo"
    source = CLIENT / "check.gen.ts"
    source.write_text(typescript_of(dash))
    out = subprocess.run([node, tsc, "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "bundler",
                          "--module", "esnext", "--target", "es2022", source.name], cwd=CLIENT, capture_output=True,
                         text=True, timeout=180, check=False)
    source.unlink()
    assert out.returncode != 0 and "titel" in out.stdout, out.stdout

"""The command line's conventions: --version, every training flag, build info, fatal errors in the configured log
format (Ctrl-C's 130: tests/integration/test_cli.py, it needs a running command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from pipeline import metrics
from pipeline.cli import build_parser
from pipeline.ops.devstack import free_port
from tests.unit.test_deploy import ROOT
from workers.training.run import build_parser as training_parser


def tierflow(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def test_version_names_the_package_version_and_the_commit() -> None:
    out = tierflow("--version")
    assert out.returncode == 0, out.stderr
    from pipeline.version import commit, version

    assert out.stdout.strip() == f"tierflow {version()} (commit {commit()})"
    assert commit() != "unknown" or not (ROOT / ".git").exists()


def test_the_build_commit_comes_from_the_environment_where_an_image_has_no_git() -> None:
    env = dict(os.environ, TIERFLOW_BUILD_COMMIT="abc123def456")
    assert tierflow("--version", env=env).stdout.strip().endswith("(commit abc123def456)")


def options(parser: object) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}  # type: ignore[attr-defined]


def test_tierflow_train_takes_every_flag_of_the_training_command() -> None:
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    assert options(train) == options(training_parser())


def test_train_passes_the_flags_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.ops import commands

    seen: list[list[str]] = []
    monkeypatch.setattr("workers.training.run.main", lambda argv: seen.append(list(argv)) or 0)
    args = build_parser().parse_args(["train", "--data", "d.csv", "--models", "charngram", "--seed", "3",
                                      "--epochs", "2"])
    assert commands.cmd_train(args) == 0
    assert seen == [["--data", "d.csv", "--models", "charngram", "--seed", "3", "--epochs", "2"]]
    # no --out unless given: training then says how to serve what it wrote
    assert "--out" not in seen[0]


def test_build_info_is_exported_once_metrics_are_served() -> None:
    port = free_port()
    metrics.serve(port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    from pipeline.version import commit, version

    assert f'tierflow_build_info{{commit="{commit()}",version="{version()}"}} 1.0' in text


def test_a_fatal_error_is_a_json_log_record_when_logs_are_json() -> None:
    env = dict(os.environ, TIERFLOW_LOG_JSON="true", TIERFLOW_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")
    out = tierflow("send", "hello", env=env)
    assert out.returncode == 2
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    assert lines and all(r["level"] == "ERROR" for r in lines), out.stderr
    assert lines[-1]["msg"].startswith("tierflow send: "), lines


def test_a_fatal_error_is_one_plain_line_otherwise() -> None:
    env = dict(os.environ, TIERFLOW_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")
    env.pop("TIERFLOW_LOG_JSON", None)
    out = tierflow("send", "hello", env=env)
    assert out.returncode == 2 and out.stderr.startswith("tierflow send: "), out.stderr

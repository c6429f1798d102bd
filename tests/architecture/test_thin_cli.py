"""`pipeline/cli.py` parses and dispatches; the commands' bodies live in `pipeline/ops/`."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

from tests.architecture.imports import ROOT, graph

CLI = ROOT / "pipeline" / "cli.py"


def test_the_cli_defines_no_command_bodies() -> None:
    tree = ast.parse(CLI.read_text())
    bodies = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("cmd_")]
    assert not bodies, f"move {bodies} to pipeline/ops/"
    lines = len(CLI.read_text().splitlines())
    assert lines < 275, f"pipeline/cli.py has {lines} lines: parser and dispatch only (22 commands)"


def test_every_subcommand_is_in_the_dispatch_table() -> None:
    from pipeline.cli import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)


def test_nothing_imports_the_cli() -> None:
    # cli is the top: it may import every layer, and no module may import it back
    importers = sorted(m for m, xs in graph().items() if "pipeline.cli" in xs)
    assert not importers, importers


def test_every_command_resolves_to_a_function() -> None:
    from pipeline.cli import COMMANDS, command

    assert all(callable(command(name)) for name in COMMANDS)


def test_importing_the_cli_loads_no_heavy_module() -> None:
    # `tierflow send` imports the cli first: the commands import their heavy modules inside themselves, and the
    # settings (pydantic) are imported after the arguments are parsed, so `--help` answers at once
    heavy = {"torch", "numpy", "transformers", "faust", "confluent_kafka", "matplotlib", "rich", "pydantic", "redis"}
    code = f"import sys, pipeline.cli; print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_send_and_answers_load_no_redis_client() -> None:
    # `tierflow send` rings its doorbell without redis-py and `tierflow answers` needs no Redis: redis-py's import
    # (it loads its asyncio client too) would be a fifth of either command's time
    code = ("import sys, pipeline.cli, pipeline.ops.commands, pipeline.adapters.doorbell, pipeline.adapters.tails, "
            "orjson; print('redis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout

"""The README's "Follow one request" names real files and functions."""

from __future__ import annotations

import ast
import re

from tests.architecture.imports import ROOT

ROW = re.compile(r"^\| *(\d+) *\| *`([^`]+)` *\| *`([^`]+)` *\|(.*)\|$")
NAMED = re.compile(r"`([\w/]+\.py)` `(\w+)`")


def defined(path: str) -> set[str]:
    """`name` and `Class.method` for everything a module defines at its top and in its classes."""
    tree = ast.parse((ROOT / path).read_text())
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        if isinstance(node, ast.ClassDef):
            out |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    return out


def steps() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    part = text[text.index("### Follow one request"):]
    part = part[:part.index("\n## ")]
    out = []
    for line in part.splitlines():
        if m := ROW.match(line):
            out.append((m[2], m[3]))
            out += NAMED.findall(m[4])  # names in the "what happens" column
    return out


def test_every_step_of_the_request_names_a_real_function() -> None:
    named = steps()
    assert len(named) >= 12
    missing = [f"{path} {name}" for path, name in named
               if not (ROOT / path).is_file() or name not in defined(path)]
    assert not missing, missing


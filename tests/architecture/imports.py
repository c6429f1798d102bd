"""The import graph of tierflow's own packages, read from the source (every import, also inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "workers", "schemas")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_of(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """What a module imports: our own modules by full name, anything else by its top-level name."""
    me = module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from pipeline import metrics` imports the module pipeline.metrics
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                while name not in known and "." in name:
                    name = name.rpartition(".")[0]
                out.add(name)
            else:
                out.add(name.split(".")[0])
    out.discard(me)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(p, known) for m, p in mods.items()}

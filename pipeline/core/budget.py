"""One core budget for every model runtime of a stack (`TIERFLOW_CPUS`). Pure.

A 2-core machine running the broker, Redis, ingest and three model workers must not let each runtime (torch,
ONNX Runtime, OpenMP, tokenizers) start a thread per core: six runtimes each sized for the whole machine fight over
it, and a llama.cpp writer with 2 threads beside one busy process decodes 4x slower than with 1. `tierflow up`
splits the budget among its model agents by weight (heavy writes and encodes, it gets the most); each gets at
least one thread, so on fewer cores than model agents the sum is their number.
"""

from __future__ import annotations

from collections.abc import Mapping

WEIGHTS: dict[str, int] = {"worker-heavy": 2, "worker-light": 1, "worker-multimodal": 1, "trainer": 1}


def split_cores(cpus: int, agents: list[str], weights: Mapping[str, int] = WEIGHTS) -> dict[str, int]:
    """Threads per model agent (those in `weights`): `cpus` shared by weight, largest remainders first, >= 1 each.

    Agents without a weight run no model runtime and get 1 (their numpy, if any, stays single-threaded).
    """
    models = [a for a in agents if a in weights]
    out = {a: 1 for a in agents}
    if not models:
        return out
    spare = max(0, cpus - len(models))  # what is left once each model agent has its one thread
    total = sum(weights[a] for a in models)
    exact = {a: spare * weights[a] / total for a in models}
    extra = {a: int(exact[a]) for a in models}
    left = spare - sum(extra.values())
    for a in sorted(models, key=lambda a: (-(exact[a] - extra[a]), -weights[a], a))[:left]:
        extra[a] += 1
    for a in models:
        out[a] = 1 + extra[a]
    return out

"""This process's share of the core budget (pipeline/core/budget.py), applied to every runtime it loads.

`tierflow up` sets `TIERFLOW_THREADS` per agent; a worker started alone (a Kubernetes pod) takes `TIERFLOW_CPUS`,
by default the cores it may run on. Applied before any runtime starts: OpenMP, MKL and OpenBLAS read their
variables once, at load; torch and ONNX Runtime sessions are sized from `threads()`.
"""

from __future__ import annotations

import os

_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
_threads: int | None = None


def available_cpus() -> int:
    """The cores this process may run on (its affinity: a container's cpuset), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def apply(threads: int) -> None:
    """Size every runtime of this process to `threads`: call it before torch, ONNX Runtime or a model loads."""
    global _threads
    _threads = max(1, threads)
    for k in _ENV:
        os.environ[k] = str(_threads)
    # Hugging Face tokenizers start a thread pool per process: one batch at a time needs none.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import sys

    if "torch" in sys.modules:  # already imported: its pool size was read; set it again
        import torch

        torch.set_num_threads(_threads)


def threads() -> int | None:
    """This process's budget (None: not applied, a runtime chooses for itself)."""
    return _threads

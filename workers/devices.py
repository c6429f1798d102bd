"""Which device a model runs on: one rule for the workers, the model backends and the benches."""

from __future__ import annotations

import logging

from pipeline.settings import Settings

log = logging.getLogger(__name__)


def resolve_device(requested: str, who: str = "model") -> str:
    """The torch device to load onto, from a tier's device setting (or `--device`).

    'auto' -> 'cuda' when a GPU is visible, else 'cpu'; 'cuda' or 'cuda:N' -> as asked when a GPU is visible,
    else 'cpu' with a warning (a worker without its GPU still answers); anything else ('cpu', 'mps') unchanged.
    `who` names the caller in the log ("heavy worker").
    """
    if requested not in ("auto", "cuda") and not requested.startswith("cuda:"):
        return requested
    try:
        import torch

        if torch.cuda.is_available():
            if requested == "auto":
                log.info("%s: device 'auto' -> cuda (%s)", who, torch.cuda.get_device_name(0))
                return "cuda"
            return requested
    except ImportError:
        pass
    log.warning("%s: no CUDA device visible; running on CPU", who)
    return "cpu"


def tier_device(settings: Settings, tier: str, override: str | None = None) -> str:
    """The device of a tier's workers: `override` (the `--device` flag) or the tier's setting, resolved."""
    return resolve_device(override or settings.tier(tier).device, f"{tier} worker")

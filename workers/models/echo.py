"""The echo backend: answers with the message itself, no model. It measures the pipeline alone."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.model import BuildModel, InferenceModel, Item, Prediction


class EchoModel:
    """Intent "echo", full confidence, the text back as the answer."""

    name = "echo"

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier, build: BuildModel | None = None) -> InferenceModel:
        return cls()

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        return [Prediction("echo", 1.0, item.text, self.name) for item in batch]

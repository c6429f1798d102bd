"""The model contract every backend follows: `setup(device)` once, then `predict(batch)` per micro-batch.

A backend sees `Item`s (text, language, optional image bytes) and returns one `Prediction` per item,
in order. The worker loop owns Kafka, batching and timing; a backend owns only the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pipeline.contracts.records import Context
    from pipeline.contracts.topics import Tier
    from pipeline.settings import Settings


@dataclass(frozen=True, slots=True)
class Item:
    """One message as a model sees it."""

    text: str
    lang: str = "en"  # "zh", "en" or another script tag from pipeline.core.features
    image: bytes | None = None
    # The customer's conversation, where there is one. Where a message is read with its conversation, `text` is the
    # conversation's turns and the message (what a classifier reads) and `said` the message itself (what a writer
    # answers).
    context: Context | None = None
    said: str | None = None
    # When tierflow received a live message (epoch ms; None for a replay: nobody waits on it): a writer's time budget
    # counts from here.
    received_ms: int | None = None

    @property
    def message(self) -> str:
        """What the customer wrote in this message."""
        return self.text if self.said is None else self.said


@dataclass(frozen=True, slots=True)
class Prediction:
    """A model's verdict on one item: the intent, how sure it is, and the customer-facing answer."""

    intent: str
    confidence: float
    answer: str
    model: str
    also: str | None = None  # a second intent the message seems to raise too (the writer answers both)
    fallback: str | None = None  # why a writer's reply was not sent and the template was (None: no writer, or sent)
    oos: float = 0.0  # out-of-scope score, 0..1: how likely the message is none of the known intents' business
    small_talk: bool = False  # chit-chat is the model's top label: answered where it is, never escalated
    write_ms: float = 0.0  # the writer's time on the batch this item was in (it waited for all of it)
    context_used: tuple[str, ...] = ()  # what of the customer's conversation the reading used (the answer says it)


@runtime_checkable
class InferenceModel(Protocol):
    """A model backend. `name` identifies it in results and metrics."""

    name: str

    def setup(self, device: str) -> None:
        """Load weights onto `device` ("cpu", "cuda", "cuda:1") and warm up, so the first message is fast."""

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        """One prediction per item, in order."""
        ...


class BuildModel(Protocol):
    """The registry's builder: backend `name` for `tier`, not yet set up. Every backend's
    `from_settings(settings, tier, build)` gets it; a composite (OCR, the HTTP classifier) builds its inner
    model with it by name, so neither the registry needs a branch per composite nor a composite the registry."""

    def __call__(self, name: str, settings: Settings, tier: Tier) -> InferenceModel: ...


class OutputCountError(RuntimeError):
    """A backend returned a different number of predictions than it was given items."""


def checked_predict(model: InferenceModel, batch: Sequence[Item]) -> list[Prediction]:
    """`model.predict(batch)`, with an explicit error when the output count is wrong."""
    preds = model.predict(batch)
    if len(preds) != len(batch):
        raise OutputCountError(f"{model.name} returned {len(preds)} predictions for {len(batch)} items")
    return preds


class ByScript:
    """Sends each item to the model that reads its script: Chinese to `zh`, the rest to `default`.

    MiniLM and the char n-gram model cannot read Chinese; a multilingual encoder can, so a tier
    pairs its main model with a multilingual one and this class splits each batch between them.
    """

    def __init__(self, default: InferenceModel, zh: InferenceModel | None) -> None:
        self.default = default
        self.zh = zh
        self._name: str | None = None

    @property
    def name(self) -> str:
        """Read each time: the default model may be a hot-swapped one (workers/models/live.py) whose name changes."""
        if self._name is not None:
            return self._name
        return self.default.name if self.zh is None else f"{self.default.name}+{self.zh.name}"

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    def setup(self, device: str) -> None:
        self.default.setup(device)
        if self.zh is not None:
            self.zh.setup(device)

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        if self.zh is None:
            return checked_predict(self.default, batch)
        zh_idx = [i for i, it in enumerate(batch) if it.lang == "zh"]
        if not zh_idx:
            return checked_predict(self.default, batch)
        zh_set = set(zh_idx)
        other_idx = [i for i in range(len(batch)) if i not in zh_set]
        out: list[Prediction | None] = [None] * len(batch)
        for idx, model in ((zh_idx, self.zh), (other_idx, self.default)):
            if idx:
                for i, p in zip(idx, checked_predict(model, [batch[i] for i in idx]), strict=True):
                    out[i] = p
        return [p for p in out if p is not None]

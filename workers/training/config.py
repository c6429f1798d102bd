"""The knobs of one training run (`TrainConfig`) and the models it can train."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from workers.models.charngram import FeatureConfig

MODELS = ("charngram", "charngram_zh", "minilm", "e5")


@dataclass(frozen=True)
class TrainConfig:
    """Knobs of one training run; the defaults are what the packaged artefacts were trained with."""

    seed: int = 0
    models: tuple[str, ...] = MODELS
    val_fraction: float = 0.1  # of the training data: picks L2 strengths and fits temperatures
    test_fraction: float = 0.2  # held out for the report when no test CSV is given
    features: FeatureConfig = field(default_factory=lambda: FeatureConfig(1, 5, 2, 2, 1.0))
    char_l2_grid: tuple[float, ...] = (3e-6, 1e-5, 3e-5)
    # the Chinese light model: character uni- and bigrams (trigrams and a lower min_df scored no better in 5-fold
    # cross-validation on the e-commerce pack's Chinese lines, with up to 6x the features)
    zh_features: FeatureConfig = field(default_factory=lambda: FeatureConfig(1, 2, 0, 2, 1.0, cjk=True))
    zh_l2_grid: tuple[float, ...] = (3e-6, 1e-5, 3e-5)
    zh_folds: int = 5  # cross-validation folds that pick its L2 strength and fit its temperature
    encoder_tuned_layers: int = 1
    encoder_epochs: int = 6
    encoder_lr: float = 1e-4
    encoder_head_lr: float = 2e-3
    encoder_batch: int = 32
    label_smoothing: float = 0.1
    e5_l2_grid: tuple[float, ...] = (1e-6, 3e-6, 1e-5)
    e5_anchor_weight_grid: tuple[float, ...] = (5.0, 10.0)  # one translated example counts as this many
    multilingual_data: Path | None = None  # jsonl {text, category}: non-English anchors for e5 (the pack's)
    # (file, label): every text of the file has that label, whatever its category says (the pack's out-of-scope
    # and chit-chat lines); CSVs join the training data, JSONLs the e5 anchors
    relabelled: tuple[tuple[Path, str], ...] = ()
    answer_examples: bool = True  # the answer templates (en, zh) as extra e5 examples of their intent
    answers_file: Path | None = None  # the domain pack's answer book those examples come from (None: no examples)
    fusion_weight_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # heavy: weight of charngram log-probs
    refit: bool = True  # after picking hyperparameters and temperature, refit on all training data

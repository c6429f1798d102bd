"""Customer-facing answers per intent, in English and Simplified Chinese.

The templates are data (workers/data/answers.json), loaded once; the light tier answers with them
directly. Languages other than "zh" get English, the lingua franca of the BANKING77 intents.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ANSWERS_FILE = Path(__file__).resolve().parent / "data" / "answers.json"
LANGUAGES = ("en", "zh")


@lru_cache(maxsize=1)
def _templates() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    data = json.loads(ANSWERS_FILE.read_text(encoding="utf-8"))
    return data["intents"], data["fallback"]


def known_intents() -> frozenset[str]:
    """Every intent that has an answer template."""
    return frozenset(_templates()[0])


def answer_for(intent: str, lang: str = "en") -> str:
    """The answer to send a customer whose message has `intent`, in `lang` ("zh" or English otherwise).

    An intent without a template gets a polite hand-over message rather than an error: a model
    trained on another label set must still produce a sendable answer.
    """
    intents, fallback = _templates()
    key = "zh" if lang.lower().startswith("zh") else "en"
    entry = intents.get(intent)
    return entry[key] if entry is not None else fallback[key]

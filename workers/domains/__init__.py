"""Domain packs: what a business's customers ask about and what it answers, as data.

A pack is a directory holding `domain.json`:

```json
{
  "name": "ecommerce",
  "business": {"en": "an online shop (Maple Market)", "zh": "网上商城（枫叶商城）"},
  "answers": "policies.json",
  "train": ["../../data/bitext/train.csv", "../../data/ecommerce/train_en_extra.csv"],
  "test": "../../data/bitext/test.csv",
  "out_of_scope": ["../../data/general/oos_en.csv", "../../data/general/oos_zh.jsonl"],
  "chitchat": ["../../data/general/chitchat_en.csv", "../../data/general/chitchat_zh.jsonl"],
  "multilingual": "../../data/ecommerce/train_zh.jsonl",
  "check": "check.jsonl"
}
```

Paths are relative to the pack. `answers` is the answer book: `{"fallback": {en, zh}, "intents": {intent: {en, zh,
"facts": [{en: [...], zh: [...], near?: {en: [...], zh: [...]}}, ...]}}}`; the light tier sends an intent's text as it
is, the heavy tier's writer grounds its reply in it and must keep its facts (a fact's `near` words: one of them must
stand in the sentence that states it, so that "24 hours" stays about what the policy says it is about). `fallback` is
also the holding message of a request handed over to a person. The `chitchat` intent (greetings, thanks, small talk) may
add `"replies": {"thanks": {en, zh}, "bye": {en, zh}}`, picked by what the message says. `train` are `text,category`
CSVs; `out_of_scope` and `chitchat` CSVs or JSONLs whose every text is none of the pack's business, or small talk
(trained as the `oos` and `chitchat` classes, whatever their rows' category; a JSONL's lines, in other languages, train
only the multilingual head); `test` is a CSV held out, `multilingual` a JSONL of `{text, category}` in other languages,
`check` an optional JSONL `{text, lang, intent, also?}` never trained on. The trained artefacts live in the pack's
`artifacts/` (`tierflow train --domain` writes there).

`ecommerce` (the design article's shop, the default) and `banking` (BANKING77, the accuracy benchmark) are built in;
`TIERFLOW_DOMAIN=/path/to/pack` serves a user's own pack, no code needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from workers.models.prompts import Fact

BUILTIN_DIR = Path(__file__).resolve().parent
BUILTIN = ("ecommerce", "banking")
DEFAULT = "ecommerce"
PACK_FILE = "domain.json"
LANGUAGES = ("en", "zh")
# Two labels every pack may train besides its intents: small talk, answered politely by the light tier, and "none of
# the above", whose probability is the out-of-scope score (a message over the threshold is handed over to a person).
CHITCHAT = "chitchat"
OUT_OF_SCOPE = "oos"

Facts = tuple[Fact, ...]
_SHAPE = ('expected a directory with domain.json {"name", "answers", "train": [CSV, ...], ...}; '
          f"built in: {', '.join(BUILTIN)}")


# An order number the customer gives ("order #58213", "purchase 732201349959", "订单号：58213"): digits, possibly
# after a short letter prefix, right after a word that says it is one.
_ORDER_ID = re.compile(r"(?:\border|\bpurchase|订单|单号)\s*(?:no\.?|number|id|编号|号)?\s*[:：#＃]?\s*"
                       r"([A-Z]{0,4}-?\d[\d-]{3,22}\d)", re.IGNORECASE)


def order_id(text: str) -> str | None:
    """The order number `text` names, if any (the first)."""
    m = _ORDER_ID.search(text)
    return m.group(1) if m else None


def about_order(answer: str, text: str, lang: str) -> str:
    """`answer`, naming the order `text` mentions first, so the customer sees which order it is about."""
    oid = order_id(text)
    if oid is None:
        return answer
    return f"订单 {oid}：{answer}" if _lang_key(lang) == "zh" else f"Order {oid}: {answer}"


# Which of chit-chat's replies a message wants: thanks and goodbyes have their own, anything else is greeted.
_SMALL_TALK = (("thanks", re.compile(r"\b(?:thanks?|thank you|thx|ty|cheers|appreciate)|谢|感谢|辛苦", re.IGNORECASE)),
               ("bye", re.compile(r"\b(?:bye|goodbye|see you|good night|cya)\b|再见|拜拜|晚安|回头见", re.IGNORECASE)))


def small_talk_kind(text: str) -> str | None:
    """"thanks" or "bye" when the message says so, else None (a greeting or other small talk)."""
    return next((kind for kind, rx in _SMALL_TALK if rx.search(text)), None)


def _lang_key(lang: str) -> str:
    # Languages other than Chinese get English: the packs are written in those two.
    return "zh" if lang.lower().startswith("zh") else "en"


@dataclass(frozen=True)
class AnswerBook:
    """Per intent: the answer in English and Chinese and the key facts a written answer must keep."""

    intents: dict[str, dict[str, Any]]
    fallback: dict[str, str]

    def answer(self, intent: str, lang: str = "en", text: str = "") -> str:
        """The answer for `intent` in `lang`; an intent the book lacks gets the polite hand-over text (a model
        trained on another label set must still produce a sendable answer). Chit-chat replies to what `text` says
        (thanks, goodbye, anything else)."""
        key = _lang_key(lang)
        entry = self.intents.get(intent)
        if entry is None:
            return self.fallback[key]
        if intent == CHITCHAT and text and "replies" in entry:
            kind = small_talk_kind(text)
            if kind in entry["replies"]:
                return str(entry["replies"][kind][key])
        return str(entry[key])

    def holding(self, lang: str = "en") -> str:
        """What a customer whose request was handed over to a person is told meanwhile."""
        return self.fallback[_lang_key(lang)]

    def facts(self, intent: str, lang: str = "en") -> Facts:
        """The key facts of `intent`'s answer, each as its accepted spellings in `lang`."""
        key = _lang_key(lang)
        entry = self.intents.get(intent) or {}
        return tuple(Fact(tuple(str(s) for s in f[key]), tuple(str(w) for w in f.get("near", {}).get(key, ())))
                     for f in entry.get("facts", ()))

    def known(self) -> frozenset[str]:
        """Every intent that has an answer."""
        return frozenset(self.intents)

    @classmethod
    def read(cls, path: Path) -> AnswerBook:
        """The book in `path` (JSON: fallback and intents, each with 'en' and 'zh'); ValueError naming what is
        wrong."""
        book = json.loads(path.read_text(encoding="utf-8"))
        intents, fallback = book["intents"], book["fallback"]
        for intent, entry in intents.items():
            for lang in LANGUAGES:
                if not isinstance(entry.get(lang), str) or not entry[lang].strip():
                    raise ValueError(f"answers: intent {intent!r} has no {lang!r} text")
            for i, fact in enumerate(entry.get("facts", ())):
                near = fact.get("near", {}) if isinstance(fact, dict) else None
                if not isinstance(near, dict) or not all(
                        _strings(fact.get(lang)) and fact[lang] and _strings(near.get(lang, [])) for lang in LANGUAGES):
                    raise ValueError(f"answers: intent {intent!r} fact {i}: expected {{\"en\": [spelling, ...], "
                                     f"\"zh\": [...], \"near\"?: {{\"en\": [word, ...], \"zh\": [...]}}}}")
        if not all(isinstance(fallback.get(lang), str) for lang in LANGUAGES):
            raise ValueError("answers: fallback needs 'en' and 'zh' texts")
        return cls(intents, fallback)


def _strings(v: object) -> bool:
    """A list of non-empty strings."""
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


@dataclass(frozen=True)
class Domain:
    """One pack, its paths resolved."""

    name: str
    path: Path
    business: dict[str, str]
    answers: AnswerBook
    answers_file: Path
    train: tuple[Path, ...]
    test: Path | None
    multilingual: Path | None
    check: Path | None
    out_of_scope: tuple[Path, ...] = ()
    chitchat: tuple[Path, ...] = ()

    @property
    def artifacts(self) -> Path:
        """Where the pack's trained models live (`tierflow train --domain` writes a version there)."""
        return self.path / "artifacts"

    @property
    def builtin(self) -> bool:
        """Whether this is one of the packs tierflow ships (its directory is inside the installed package)."""
        return self.path.parent == BUILTIN_DIR and self.path.name in BUILTIN

    def relabelled(self) -> tuple[tuple[Path, str], ...]:
        """(file, label) for the lines trained under a label of their file's, not their rows': the out-of-scope
        class and chit-chat."""
        return (*((p, OUT_OF_SCOPE) for p in self.out_of_scope), *((p, CHITCHAT) for p in self.chitchat))

    def business_of(self, lang: str) -> str:
        """What the business is, for a prompt in `lang`."""
        return self.business.get(_lang_key(lang)) or self.business.get("en", "a business")

    def data_dirs(self) -> list[Path]:
        """The directories the training data comes from (their licences travel with the weights)."""
        out: list[Path] = []
        for p in (*self.train, *self.out_of_scope, *self.chitchat,
                  *(x for x in (self.test, self.multilingual) if x is not None)):
            if p.parent not in out:
                out.append(p.parent)
        return out


def load_domain(name_or_dir: str | Path) -> Domain:
    """The built-in pack `name_or_dir` names, or the pack in that directory. ConfigError, one line, otherwise."""
    return _load(str(name_or_dir))


@lru_cache(maxsize=8)
def _load(spec: str) -> Domain:
    where = BUILTIN_DIR / spec if spec in BUILTIN else Path(spec).expanduser()
    file = where / PACK_FILE
    if not file.is_file():
        raise ConfigError(f"domain {spec!r}: no {file} ({_SHAPE})")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
        return _parse(raw, where.resolve())
    except (ValueError, KeyError, TypeError, OSError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise ConfigError(f"domain {spec!r}: {file}: {detail} ({_SHAPE})") from None


def _parse(raw: dict[str, Any], root: Path) -> Domain:
    def path(rel: str | None, what: str) -> Path | None:
        if rel is None:
            return None
        p = (root / rel).resolve()
        if not p.is_file():
            raise ValueError(f"{what} {rel!r}: no such file")
        return p

    book_file = path(raw["answers"], "answers")
    assert book_file is not None
    train = raw["train"]
    if isinstance(train, str):
        train = [train]
    if not train:
        raise ValueError("train: no CSV named")
    business = raw.get("business") or {}
    return Domain(
        name=str(raw["name"]), path=root,
        business={str(k): str(v) for k, v in business.items()},
        answers=AnswerBook.read(book_file), answers_file=book_file,
        train=tuple(p for p in (path(t, "train") for t in train) if p is not None),
        test=path(raw.get("test"), "test"), multilingual=path(raw.get("multilingual"), "multilingual"),
        check=path(raw.get("check"), "check"),
        out_of_scope=tuple(p for p in (path(t, "out_of_scope") for t in raw.get("out_of_scope", ())) if p),
        chitchat=tuple(p for p in (path(t, "chitchat") for t in raw.get("chitchat", ())) if p),
    )

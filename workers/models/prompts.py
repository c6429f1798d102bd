"""Prompts for answer generators: what a generator is asked (`GenerationRequest`), the `Generator` protocol,
the chat messages built from a request, and the checks on what comes back (tidy, in the right language).

Both local generators (`generator.py`) and the chat-server backend (`http.py`) depend on this module and not on
each other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# A customer message longer than this is cut before prompting: the intent is already known and the
# prompt's cost (prefill time, KV memory) grows with every character.
MAX_MESSAGE_CHARS = 1000

# The conversation in a prompt: the last turns, each cut short (prefill time grows with every character).
MAX_HISTORY_TURNS = 3
MAX_TURN_CHARS = 200
_SLOT_NAMES = {"order_id": "order number", "product": "product", "amount": "amount"}
_LANGUAGE_NAMES = {"en": "English", "zh": "Simplified Chinese (简体中文)"}
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_ECHOED_LABEL = re.compile(r"^(customer message|reply|answer|assistant)\s*:\s*", re.IGNORECASE)
# A letter's opening line on its own: short, ending in a comma or colon ("Dear [Customer's Name],", "Hello!").
_SALUTATION = re.compile(r"^[^\n.?。？]{0,40}[,:，：!！]$")
# A template slot the model left unfilled, with the space before it: "Hello [Name], ..." -> "Hello, ...".
_PLACEHOLDER = re.compile(r"\s*\[[^\]\n]{1,40}\]")
SENTENCE_END = re.compile(r"[.!?。！？](?=\s|$)|[。！？]")


@dataclass(frozen=True, slots=True)
class Fact:
    """A key fact of a policy that a written reply must keep, in the reply's language.

    `spellings`: any one of them kept is the fact kept. `near`: where a bare number could be bent to mean something
    else ("within 24 hours" of the parcel arriving, where the policy says tracking starts within 24 hours), words
    one of which must stand in the same sentence as the spelling; empty: anywhere will do.
    """

    spellings: tuple[str, ...]
    near: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the generator needs to word one answer."""

    text: str  # the customer's message
    lang: str  # "en", "zh", ...: the language to answer in
    intent: str  # the classifier's label
    reference: str = ""  # the template answer (or the policy) for the intent, as grounding
    # The key facts a reply must keep (days, amounts, where to click), each as its spellings in `lang`: a reply
    # that drops one is not sent (`missing_facts`).
    facts: tuple[Fact, ...] = ()
    business: str = "a shop"  # who the customer writes to (the domain pack's `business`)
    also: str = ""  # the policy of a second intent the message raises ("screen cracked, invoice lost"), if any
    # The conversation so far: (what the customer wrote, what we answered) per earlier turn, oldest first, and the
    # details they gave (order number, product, amount), so "order 58213" is answered about that order.
    history: tuple[tuple[str, str], ...] = ()
    slots: tuple[tuple[str, str], ...] = ()
    # When the reply must be written by (epoch seconds; None: only the generator's own budget per call): a reply
    # the clock would cut is not started, one it cuts is dropped, and the template goes out (fallback "timeout").
    deadline: float | None = None


@runtime_checkable
class Generator(Protocol):
    """Writes one reply per request, in order; "" where it has nothing (the caller falls back), or where the
    request's `deadline` passed before its reply was written."""

    name: str

    def setup(self, device: str) -> None:
        """Load onto `device` and warm up."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        """One reply per request, in order."""
        ...


class PrefillingGenerator(Generator, Protocol):
    """A generator with a prompt cache: it says so with `prefills = True`, and `prefill` evaluates prompts into that
    cache (a reply of one token) so that the first reply in each language does not pay for its system prompt."""

    prefills: bool

    def prefill(self, requests: Sequence[GenerationRequest]) -> None:
        """Evaluate each request's prompt into the cache; the replies are not kept."""
        ...


class YieldingGenerator(Generator, Protocol):
    """A generator that stops writing when told that others wait: it says so with `yields = True`, and asks
    `interrupt()` as it writes (True: the reply in progress and the call's rest are "")."""

    yields: bool
    interrupt: Callable[[], bool] | None


class StreamingGenerator(Generator, Protocol):
    """A generator that can hand out each reply as it is written: it says so with `streams = True` (a protocol's
    isinstance checks names, not signatures)."""

    streams: bool

    def generate(self, requests: Sequence[GenerationRequest],
                 on_text: Callable[[int, str], None] | None = None) -> list[str]:
        """One reply per request, in order; `on_text(i, reply so far)` as request i's reply grows."""
        ...


def language_name(lang: str) -> str:
    """The language tag as a prompt can name it."""
    return _LANGUAGE_NAMES.get(lang, "the same language as the customer's message")


def build_messages(req: GenerationRequest) -> list[dict[str, str]]:
    """The chat prompt for one request: the intent, the reference answer, its key facts and the customer's message."""
    language = language_name(req.lang)
    system = (
        f"You are a customer-service assistant for {req.business}. "
        f"Reply in {language}, in two to four short sentences. Be polite and practical. "
        "Answer from our policy only: keep its numbers of days, amounts and where to click exactly as written. "
        "Never invent order numbers, amounts or dates. Write the reply itself: no greeting line, no signature, no "
        "placeholders such as [Name]."
    )
    message = req.text.strip()[:MAX_MESSAGE_CHARS]
    # The customer's message comes before the policy, and the facts to keep come last, next to the reply. With the
    # policy first (a longer prefix for the writer's prompt cache to reuse: 0.9x the whole reply's time) Qwen2.5-1.5B
    # kept every fact in 60% of the check set's replies (48% with the facts first too) against 68% in this order
    # (bench.generation, 2026-12-07); the cache still holds each language's system prompt.
    user = ""
    if req.history:
        user += "Earlier in this conversation:\n" + "".join(
            f"Customer: {said[:MAX_TURN_CHARS]}\n" + (f"We answered: {ours[:MAX_TURN_CHARS]}\n" if ours else "")
            for said, ours in req.history[-MAX_HISTORY_TURNS:])
    if req.slots:
        user += "Details the customer gave: " + "; ".join(f"{_SLOT_NAMES.get(k, k)} {v}" for k, v in req.slots) + \
            " (use them; never invent others)\n"
    user += f"Customer message: {message}\nTopic: {req.intent.replace('_', ' ').rstrip('?')}\n"
    if req.reference:
        user += f"Our policy for this topic: {req.reference}\n"
    if req.also:
        user += f"The message also raises this; our policy: {req.also}\n"
    if req.facts:
        user += "Your reply must contain each of these, exactly as written: " + \
            ", ".join(f'"{f.spellings[0]}"' for f in req.facts if f.spellings) + "\n"
    user += f"Write a short, helpful reply to the customer in {language}."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def tidy(text: str) -> str:
    """Trim a generated reply to its first paragraph, dropping a last sentence cut off by the budget."""
    # Small models follow the reply with commentary ("This is a polite reply...", "P.S."): the first
    # paragraph is the reply, once a letter's salutation ("Dear [Customer's Name]," / "您好，") is set aside.
    paragraphs = [p.strip() for p in text.strip().split("\n\n") if p.strip()]
    while len(paragraphs) > 1 and _SALUTATION.match(paragraphs[0]):
        paragraphs.pop(0)
    text = _PLACEHOLDER.sub("", paragraphs[0] if paragraphs else "").strip()
    text = _ECHOED_LABEL.sub("", text).strip().strip('"').strip()  # a prompt label parroted back
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    # Drop the unfinished tail only when a whole sentence stays; half a reply beats none.
    if ends and ends[-1] < len(text):
        text = text[: ends[-1]].rstrip()
    return text


# An English reply may quote a Chinese product or place name; more than this share of CJK characters among its
# letters is a reply in Chinese (qwen2.5-coder-0.5b answered English prompts in Chinese).
MAX_CJK_SHARE_EN = 0.2


def in_language(text: str, lang: str) -> bool:
    """Whether `text` plausibly is in `lang`: small models answer Chinese messages in English, and English ones in
    Chinese."""
    if lang == "zh":
        return bool(_CJK.search(text))
    if lang == "en":
        letters = sum(1 for c in text if c.isalpha())
        return letters > 0 and len(_CJK.findall(text)) <= MAX_CJK_SHARE_EN * letters
    return True


def _folded(text: str) -> str:
    # Case, spaces and the hyphen kinds a model varies ("1-year", "1 year", "3–5 working days", "30 天") fold away.
    return re.sub(r"[\s\-\u2010-\u2015]+", "", text).casefold()


def _sentences(text: str, ends: re.Pattern[str] = SENTENCE_END) -> list[str]:
    starts = [0, *(m.end() for m in ends.finditer(text))]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True) if text[a:b].strip()]


# A clause ends where a sentence does, or at a comma or semicolon ("1,000" is one number, not two clauses).
_CLAUSE_END = re.compile(SENTENCE_END.pattern + r"|[，；;]|,(?=\s)")


def _kept_in(text: str, fact: Fact) -> bool:
    got = _folded(text)
    return any(_folded(s) in got for s in fact.spellings)


def missing_facts(reply: str, facts: Sequence[Fact]) -> list[int]:
    """The indexes of the facts `reply` does not keep: a fact is kept when any of its spellings appears in it."""
    return [i for i, f in enumerate(facts) if not _kept_in(reply, f)]


def misplaced_facts(reply: str, facts: Sequence[Fact]) -> list[int]:
    """The indexes of the facts `reply` states about something else: a spelling is there, but in no clause with
    one of the fact's `near` words ("您的包裹将在24小时内送达" for "发货后24小时内会更新物流信息"; a clause, not a
    sentence: "订单已在物流中查询，预计在24小时内会收到包裹" has 物流 in the sentence, not where the 24 hours are)."""
    out = []
    for i, f in enumerate(facts):
        if not f.near or not _kept_in(reply, f):
            continue
        if not any(_kept_in(c, f) and any(_folded(w) in _folded(c) for w in f.near)
                   for c in _sentences(reply, _CLAUSE_END)):
            out.append(i)
    return out


# A number: digits with the separators of amounts, decimals and times ("2,000", "120.00", "8:00"); a list marker
# ("1. ", "2) ") at a line's start is not one.
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:[.:]\d+)*")
_LIST_MARKER = re.compile(r"(?m)^\s*\d{1,2}[.)]\s")


# Full-width digits are digits; a full-width comma stays a comma of the sentence ("1234567890，24小时" is two numbers).
_FULL_WIDTH_DIGITS = {0xFF10 + i: str(i) for i in range(10)}


def _numbers(text: str) -> set[str]:
    text = _LIST_MARKER.sub(" ", text.translate(_FULL_WIDTH_DIGITS))
    return {m.group().replace(",", "") for m in _NUMBER.finditer(text)}


def invented_numbers(reply: str, grounding: Iterable[str]) -> list[str]:
    """The numbers in `reply` found in none of `grounding` (the policy, the customer's words): a price, a date or
    an order number the writer made up. A grounded "8:00" or "¥2,000" allows its parts ("8", "2000") too.
    Chinese numerals (两, 一年) are not read: the key facts cover those the policies state."""
    allowed: set[str] = set()
    for g in grounding:
        for n in _numbers(g):
            allowed |= {n, *re.split(r"[.:]", n)}
    return sorted(_numbers(reply) - allowed)


# A Chinese clause ends at a full-width comma or semicolon too; an English ", " does not here (an English clause
# dropped leaves its sentence without a verb more often than not).
ZH_CLAUSE_END = re.compile(SENTENCE_END.pattern + r"|[，；]")


def without_invented(reply: str, grounding: Sequence[str], ends: re.Pattern[str] = SENTENCE_END) -> str:
    """`reply` less its sentences (or, with `ZH_CLAUSE_END`, clauses) that hold a number neither the policy nor the
    customer gave ("您的订单号是1234567890。" before a faithful answer): what is left is the writer's still, checked
    again. A dropped clause that ended its sentence leaves the clause before it to end it."""
    kept: list[str] = []
    for x in _sentences(reply, ends):
        if not invented_numbers(x, grounding):
            kept.append(x)
        elif kept and kept[-1].rstrip()[-1:] in ("，", "；") and SENTENCE_END.search(x.rstrip()[-1:]):
            kept[-1] = kept[-1].rstrip()[:-1] + x.rstrip()[-1]
    return "".join(kept).strip()

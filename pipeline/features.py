"""Pure feature extraction: Request -> Features. No I/O; VIP membership is passed in.

Lengths are CJK-aware: a Chinese message has no spaces, so "words" are counted per Han character
(one character is roughly one token), and runs of other letters count as words.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.contracts import Request

_HAN = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA_HANGUL = r"\u3040-\u30ff\uac00-\ud7af"
_HAN_RE = re.compile(f"[{_HAN}]")
_OTHER_CJK_RE = re.compile(f"[{_KANA_HANGUL}]")
_LATIN_RE = re.compile(r"[A-Za-z]")
# One token per CJK character, one per run of letters/digits elsewhere.
_TOKEN_RE = re.compile(f"[{_HAN}{_KANA_HANGUL}]|[^\\s{_HAN}{_KANA_HANGUL}\\W]+|[^\\w\\s]", re.UNICODE)

# Cue words: looked up in a set of the message's words (one regex pass), which is an order of magnitude
# cheaper than alternation regexes on the ingest hot path.
_WORD_TOKEN_RE = re.compile(r"[a-z0-9_']+|[^\w\s]")
_Q_WORDS = frozenset({"how", "why", "what", "when", "where", "which", "who", "could", "does"})
_Q_ZH = ("吗", "怎么", "如何", "为什么", "什么", "哪", "是否", "能否", "可以")
_C_WORDS = frozenset({"broken", "refund", "terrible", "awful", "angry", "complain", "complaint", "complaining",
                      "worst", "unacceptable", "disappointed", "scam", "ridiculous", "wrong"})
_C_ZH = ("投诉", "坏了", "退款", "差评", "生气", "太差", "失望", "骗", "不能用", "扣了两次")
_U_WORDS = frozenset({"urgent", "asap", "immediately", "emergency", "fraud", "fraudulent", "stolen", "hacked",
                      "unauthorized", "unauthorised"})
_U_ZH = ("紧急", "马上", "立刻", "被盗", "盗刷", "诈骗")
# Multi-word cues, one pass over the lowercased text; the group name says which cue matched.
_PHRASE_RE = re.compile(
    r"\b(?:(?P<q>can i|is it|do i|can you|is there)|"
    r"(?P<c>not working|doesn'?t work|still waiting|still not|charged twice)|(?P<u>right now))\b"
)


def _cues(text: str, low: str, words: list[str], ascii_only: bool) -> tuple[bool, bool, bool]:
    """(question, complaint, urgent) from word sets, phrases and, for non-ASCII text, Chinese cue strings."""
    ws = set(words)
    question = "?" in text or not ws.isdisjoint(_Q_WORDS)
    complaint = not ws.isdisjoint(_C_WORDS)
    urgent = not ws.isdisjoint(_U_WORDS)
    if not (question and complaint and urgent):
        for m in _PHRASE_RE.finditer(low):
            kind = m.lastgroup
            question = question or kind == "q"
            complaint = complaint or kind == "c"
            urgent = urgent or kind == "u"
    if not ascii_only:
        question = question or "？" in text or any(c in text for c in _Q_ZH)
        complaint = complaint or any(c in text for c in _C_ZH)
        urgent = urgent or any(c in text for c in _U_ZH)
    return question, complaint, urgent


def script_of(text: str) -> str:
    """The dominant script: "zh" when Han characters are a fair share of the letters, "en" for Latin."""
    if not text:
        return "none"
    han = len(_HAN_RE.findall(text))
    latin = len(_LATIN_RE.findall(text))
    if han and han * 3 >= latin:  # a Chinese sentence with an English product name is still Chinese
        return "zh"
    if latin:
        return "en"
    if _OTHER_CJK_RE.search(text):
        return "other"
    return "other" if any(ch.isalpha() for ch in text) else "none"


def token_count(text: str) -> int:
    """Tokens-equivalent: CJK characters one each, other words and punctuation one each."""
    return len(_TOKEN_RE.findall(text))


def lang_of(script: str, hint: str | None) -> str:
    """The language a model should assume: the producer's hint wins, else the script."""
    if hint:
        return hint.split("-")[0].lower()
    return {"zh": "zh", "en": "en"}.get(script, "other" if script != "none" else "en")


def extract(req: Request, *, vip: bool, image_bytes: int = 0) -> dict[str, Any]:
    """Features of one request (the `features` object of schemas/routed.v1.json)."""
    return extract_fields(req.text or "", req.lang, req.image is not None, image_bytes, vip)


def extract_fields(text: str, lang_hint: str | None, has_image: bool, image_bytes: int, vip: bool) -> dict[str, Any]:
    """`extract` on plain fields (the ingest hot path has a dict, not a Request)."""
    low = text.lower()
    ascii_only = text.isascii()
    words = _WORD_TOKEN_RE.findall(low)
    if ascii_only:  # the common case, without the Unicode-class regexes
        script = "en" if _LATIN_RE.search(text) else "none"  # ASCII letters are Latin
        tokens = len(words)
    else:
        script = script_of(text)
        tokens = token_count(text)
    question, complaint, urgent = _cues(text, low, words, ascii_only)
    return {
        "chars": len(text),
        "tokens": tokens,
        "script": script,
        "lang": lang_of(script, lang_hint),
        "has_image": has_image,
        "image_bytes": image_bytes,
        "vip": vip,
        "question": question,
        "complaint": complaint,
        "urgent": urgent,
    }

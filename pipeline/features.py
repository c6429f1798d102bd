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

_QUESTION_RE = re.compile(
    r"[?？]|\b(how|why|what|when|where|which|who|can i|could|is it|do i|does)\b|吗|怎么|如何|为什么|什么|哪|是否|能否|可以",
    re.IGNORECASE,
)
_COMPLAINT_RE = re.compile(
    r"\b(broken|refund|terrible|awful|angry|complain\w*|worst|unacceptable|disappointed|scam|ridiculous|"
    r"not working|doesn'?t work|still (?:waiting|not)|charged twice|wrong)\b|投诉|坏了|退款|差评|生气|太差|失望|骗|不能用|扣了两次",
    re.IGNORECASE,
)
_URGENT_RE = re.compile(
    r"\b(urgent|asap|immediately|right now|emergency|fraud\w*|stolen|hacked|unauthori[sz]ed)\b|紧急|马上|立刻|被盗|盗刷|诈骗",
    re.IGNORECASE,
)


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
    text = req.text or ""
    script = script_of(text)
    return {
        "chars": len(text),
        "tokens": token_count(text),
        "script": script,
        "lang": lang_of(script, req.lang),
        "has_image": req.image is not None,
        "image_bytes": image_bytes,
        "vip": vip,
        "question": bool(_QUESTION_RE.search(text)),
        "complaint": bool(_COMPLAINT_RE.search(text)),
        "urgent": bool(_URGENT_RE.search(text)),
    }

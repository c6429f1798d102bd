"""Pure slot extraction and follow-up detection for customer messages, English and Chinese. No I/O.

A slot is a fact an answer can be keyed on: the order id, the product, the amount paid. A follow-up is a message
that reads only beside an earlier turn ("order 58213", "what about the other one?", "那个呢").

Every pattern has bounded repetition and no nested unbounded quantifier, so a hostile 32 KiB message costs a few
linear regex passes; `is_follow_up` looks only at a message's opening and at short messages. Every value is a
substring of the text, at most MAX_SLOT_CHARS characters.
"""

from __future__ import annotations

import re

from pipeline.core.features import routed_length, script_of

MAX_SLOT_CHARS = 64  # a slot value longer than this is cut (hostile input stays bounded)
SLOT_NAMES = ("order_id", "product", "amount")

# Patterns run on a lowered copy of the text, case-sensitively, and open with a literal or a character class: the
# regex engine then skips to candidate characters in one C loop instead of trying every alternative at every
# position (re.IGNORECASE or a leading look-behind turns that off; measured 5-10x slower on 32 KiB). A left word
# boundary is therefore a look-behind placed after the first character: "x(?<![a-z].)".
_NOT_AFTER_LETTER = "(?<![a-z].)"


def _word(word: str) -> str:
    """`word` not preceded by an ASCII letter (Han characters are word characters, so \\b would miss "我的laptop")."""
    return re.escape(word[0]) + _NOT_AFTER_LETTER + re.escape(word[1:]).replace(r"\ ", "[ -]?")


_CURRENCY_AFTER = " ?(?:元|块|塊|(?:dollars?|bucks|usd|yuan|rmb|cny|euros?|eur)(?![a-z]))"
# Thousands separators or a plain run, then at most two decimals; "(?!\d)" keeps a longer run from being cut, and
# the atomic group "(?>...)" stops the retries of shorter splits that cannot match either.
_NUMBER_TAIL = r"(?>(?:\d{0,2}(?:,\d{3}){1,4}|\d{0,11})(?!\d)(?:\.\d{1,2})?)"
# A currency sign or code before the number ("$45", "USD 45", "¥299"), or a currency word after it ("299元",
# "45 dollars"): two patterns, as one opening with a digit would lose the fast skip for both.
_AMOUNT_BEFORE_RE = re.compile(
    "(?:" + "|".join([*map(re.escape, "$¥￥€£"), *map(_word, ("us$", "usd", "rmb", "cny", "eur"))])
    + rf") ?\d{_NUMBER_TAIL}"
)
_AMOUNT_AFTER_RE = re.compile(rf"\d(?<![\d.,]\d){_NUMBER_TAIL}{_CURRENCY_AFTER}")

# 5 to 12 digits, not the head of a longer run or of a decimal, and not a price ("12999元").
_ID_TAIL = rf"\d{{4,11}}+(?!\d|[.,]\d)(?!{_CURRENCY_AFTER})"
# Standing alone: not the tail of a digit run, a decimal, a code ("sf1234567890") or a price ("$12345", "usd 12345").
_ORDER_ID_RE = re.compile(
    r"\d(?<![\d$¥￥€£a-z]\d)(?<!\d[.,]\d)(?<![$¥￥€£] \d)(?<!usd \d)(?<!rmb \d)(?<!cny \d)(?<!eur \d)" + _ID_TAIL
)
# Named as an order ("order 58213", "order number is #58213", "no. 58213", "订单号是58213"): wins over a bare run,
# which may be a phone number.
_ORDER_CUE_RE = re.compile(
    "(?:" + _word("order") + "(?: ?(?:number|num|no\\.?|id))?|" + _word("no.") + "|#|订单(?:编号|号码?)?|单号)"
    + rf"(?>(?: ?(?:is|was|:|：|是|为|=))? ?#? ?)(\d{_ID_TAIL})"
)

# The shop's goods, English plurals included; longest first, so "笔记本电脑" wins over "笔记本" where both start.
_PRODUCTS_EN = ("phone", "smartphone", "cellphone", "headphone", "earphone", "earbud", "laptop", "charger", "tablet",
                "watch", "smartwatch", "camera", "speaker", "keyboard", "monitor", "tv", "kettle", "vacuum", "fan",
                "shoe", "jacket", "backpack", "cable", "power bank")
_PRODUCTS_ZH = ("手机", "耳机", "笔记本", "笔记本电脑", "充电器", "平板", "平板电脑", "手表", "相机", "音箱",
                "键盘", "鼠标", "显示器", "电视", "电水壶", "水壶", "吸尘器", "风扇", "鞋", "外套", "背包", "数据线",
                "充电宝")
_PRODUCT_RE = re.compile("|".join(sorted(
    [*(_word(w) + "(?:es|s)?(?![a-z])" for w in (*_PRODUCTS_EN, "mouse", "mice")), *_PRODUCTS_ZH], key=len, reverse=True
)))
# A screen is usually part of a product named beside it ("手机屏幕碎了"): the product only when nothing else is.
_SCREEN_RE = re.compile(_word("screen") + "s?(?![a-z])|屏幕")


def _lowered(text: str) -> str:
    """`text` lowered character for character, so spans in it are spans in `text` ("İ" alone lowers to two)."""
    return text.replace("\u0130", "I").lower()


def _first(*matches: re.Match[str] | None) -> re.Match[str] | None:
    """The match that starts first, if any."""
    return min((m for m in matches if m), key=lambda m: m.start(), default=None)


def _slot_spans(text: str) -> dict[str, tuple[int, int]]:
    """Where each slot's first mention stands, in SLOT_NAMES order; an order id named as one before a bare one."""
    low = _lowered(text)
    spans: dict[str, tuple[int, int]] = {}
    cued = _ORDER_CUE_RE.search(low)
    if cued:
        spans["order_id"] = cued.span(1)
    elif bare := _ORDER_ID_RE.search(low):
        spans["order_id"] = bare.span()
    if product := _PRODUCT_RE.search(low) or _SCREEN_RE.search(low):
        spans["product"] = product.span()
    if amount := _first(_AMOUNT_BEFORE_RE.search(low), _AMOUNT_AFTER_RE.search(low)):
        spans["amount"] = amount.span()
    return spans


def extract(text: str, lang: str) -> dict[str, str]:
    """Slots mentioned in `text`: order_id, product, amount, each at most once (its first mention), values exactly
    as written (substrings of `text`), at most MAX_SLOT_CHARS characters each.

    `lang` does not narrow the search: a Chinese message often names goods or prices in English, and back.
    """
    return {name: text[start:min(end, start + MAX_SLOT_CHARS)] for name, (start, end) in _slot_spans(text).items()}


# A slot-only reply or a short question is short; a longer message has something of its own to say, and only
# its opening is read, whatever its length.
_SHORT_MAX_CHARS = 2 * MAX_SLOT_CHARS
_EDGE_PUNCT = " \t\r\n?？!！.。,，、~～…:：;；\"'“”‘’()（）"
_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\W_a-z0-9]")  # English words whole, Han characters one each
_FILLERS_EN = frozenset({"order", "orders", "number", "no", "id", "is", "it", "it's", "its", "my", "the", "a", "an",
                         "here", "this", "that", "that's", "and", "for", "of", "please", "pls", "ok", "okay", "thanks"})
_FILLERS_ZH_RE = re.compile("订单号|订单|单号|编号|号码|号|我的|是|为|的|了|呢|啊|吧|哦|嗯")
_OPENERS_EN = frozenset({"and", "but", "also", "plus", "or", "then", "otherwise"})
_OPENER_PAIRS_EN = frozenset({("what", "about"), ("how", "about"), ("what", "if")})
_BACKREF_EN = frozenset({"it", "it's", "its", "that", "that's", "this", "these", "those", "they", "them", "one"})
_QUESTION_HEADS_EN = frozenset({"can", "could", "will", "would", "is", "are", "does", "do", "did", "should", "how",
                                "what", "when", "where", "why", "which"})
_SHORT_EN = 30  # characters, an English short question's limit
# "那" opens "那…呢", "那个呢", "那么…"; "要多久"/"多久" ask about something named before. "如果" alone opens many a
# message of its own ("如果商品有质量问题可以退货吗"): a follow-up only as "如果…呢".
_OPENERS_ZH = ("那", "还有", "另外", "而且", "但是", "可是", "不过", "然后", "要多久", "多久")
_IF_ZH = ("如果", "要是")
_BACKREF_ZH_RE = re.compile("[这它那]")
_QUESTION_ZH_RE = re.compile("[?？吗呢]|多久|多少|怎么|什么|如何|可不可以|能不能|行不行")
_SHORT_ZH = 10  # characters, a Chinese short question's limit
_TOPIC_NE_ZH = 5  # characters: "发票呢？", a bare topic and 呢, asks "what about X?" ("怎么还没到呢" asks its own)


def _slot_only(text: str) -> bool:
    """Slots and filler words around them, and under 3 English-equivalent characters of anything else."""
    spans = _slot_spans(text)
    if not spans:
        return False
    rest = text
    for start, end in sorted(spans.values(), reverse=True):
        rest = f"{rest[:start]} {rest[end:]}"
    rest = _FILLERS_ZH_RE.sub(" ", rest.lower().replace("’", "'"))
    # Digits left are a second order id or a count ("58213 and 58214"), nothing of the message's own.
    meaningful = "".join(w for w in _WORD_RE.findall(rest) if w not in _FILLERS_EN and not w.isdigit())
    return routed_length(meaningful) < 3


def _follow_up_zh(head: str, text: str, short: bool, asked: bool) -> bool:
    if head.startswith(_OPENERS_ZH) or (head.startswith(_IF_ZH) and text.rstrip(_EDGE_PUNCT).endswith("呢")):
        return True
    if not short or len(head) >= _SHORT_ZH:
        return False
    if head.endswith("呢") and len(head) <= _TOPIC_NE_ZH:
        return True
    return (asked or _QUESTION_ZH_RE.search(head) is not None) and _BACKREF_ZH_RE.search(head) is not None


def _follow_up_en(head: str, short: bool, asked: bool) -> bool:
    words = _WORD_RE.findall(head.lower().replace("’", "'"))
    if words and (words[0] in _OPENERS_EN or tuple(words[:2]) in _OPENER_PAIRS_EN):
        return True
    if not words or not short or len(head) >= _SHORT_EN:
        return False
    return (asked or words[0] in _QUESTION_HEADS_EN) and not _BACKREF_EN.isdisjoint(words)


def is_follow_up(text: str, lang: str) -> bool:
    """True when the message reads as a continuation of an earlier turn rather than a message of its own: a
    slot-only reply ("order 58213", "订单号是58213", "#2024113005"), an elliptical question opening with a
    connective ("and if I lost the invoice?", "what about the other one?", "那发票丢了呢？", "如果…呢", "要多久？"),
    or a very short question with a pronoun referring back ("how long will that take?", "is it free?", "这个可以吗").

    The Chinese rules apply when `lang` is Chinese or the opening is written mostly in Han characters (a language
    hint can be wrong); English ones otherwise.
    """
    head = text[:_SHORT_MAX_CHARS].strip(_EDGE_PUNCT)
    if not head:
        return False
    short = len(text) <= _SHORT_MAX_CHARS
    if short and _slot_only(text):
        return True
    asked = text.rstrip().endswith(("?", "？"))
    if lang.lower().startswith("zh") or script_of(head) == "zh":
        return _follow_up_zh(head, text, short, asked)
    return _follow_up_en(head, short, asked)

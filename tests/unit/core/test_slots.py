"""Slots (order id, product, amount) and follow-up detection, English and Chinese: pure, no services."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.slots import MAX_SLOT_CHARS, SLOT_NAMES, extract, is_follow_up


@pytest.mark.parametrize(("text", "order_id"), [
    ("where is my order 58213?", "58213"),
    ("Order #2024113005 never arrived", "2024113005"),
    ("order number is 123456789012", "123456789012"),
    ("ORDER NO. 58213", "58213"),
    ("order id: #58213", "58213"),
    ("#2024113005", "2024113005"),
    ("it's 58213", "58213"),
    ("订单号是58213", "58213"),
    ("我的订单号：2024113005，还没到", "2024113005"),
    ("单号 58213", "58213"),
    ("订单2024113005什么时候发货", "2024113005"),
    ("58213呢", "58213"),
    # Named as an order wins over a bare run earlier in the text (a phone number, say).
    ("call me on 13812345678 about order 58213", "58213"),
    ("电话13812345678，订单号58213", "58213"),
    # No cue: the first bare run.
    ("58213 and 58214", "58213"),
])
def test_order_id(text: str, order_id: str) -> None:
    assert extract(text, "zh" if not text.isascii() else "en")["order_id"] == order_id


@pytest.mark.parametrize("text", [
    "I paid $45 in 2024",
    "I paid $12345 for it",
    "USD 12345 was charged",
    "it cost 12345 dollars",
    "花了12999元",
    "￥12345",
    "1234",                      # too short
    "1234567890123",             # too long: a card or account number, not an order id
    "12345.67",                  # a decimal
    "tracking SF1234567890",     # part of a code
    "order number please",
    "",
])
def test_no_order_id(text: str) -> None:
    assert "order_id" not in extract(text, "en")


@pytest.mark.parametrize(("text", "amount"), [
    ("I was charged $45 twice", "$45"),
    ("refund $45.50 please", "$45.50"),
    ("it was $ 1,299.00", "$ 1,299.00"),
    ("paid 45 dollars", "45 dollars"),
    ("USD 45 for shipping?", "USD 45"),
    ("only €20", "€20"),
    ("¥299的耳机", "¥299"),
    ("花了￥299", "￥299"),
    ("退我299元", "299元"),
    ("才299块钱", "299块"),
    ("it was 299 yuan", "299 yuan"),
    ("order 58213 cost $45", "$45"),
])
def test_amount(text: str, amount: str) -> None:
    assert extract(text, "en")["amount"] == amount


@pytest.mark.parametrize("text", ["order 58213", "I have 2 phones", "3 dollarsigns", "in 2024", "version 1.5"])
def test_no_amount(text: str) -> None:
    assert "amount" not in extract(text, "en")


@pytest.mark.parametrize(("text", "product"), [
    ("my phone is broken", "phone"),
    ("My Smartphone won't charge", "Smartphone"),
    ("the headphones arrived", "headphones"),
    ("two chargers missing", "chargers"),
    ("the POWER BANK is hot", "POWER BANK"),          # longest first: not "bank"
    ("a powerbank", "powerbank"),
    ("my TV and the remote", "TV"),
    ("the mice don't work", "mice"),
    ("my new watches", "watches"),
    ("new shoes", "shoes"),
    ("screen cracked", "screen"),                     # the screen only when nothing else is named
    ("phone screen cracked", "phone"),
    ("我的手机屏幕碎了", "手机"),
    ("笔记本电脑开不了机", "笔记本电脑"),             # longest first: not "笔记本"
    ("笔记本坏了", "笔记本"),
    ("电水壶漏水", "电水壶"),
    ("充电宝和数据线", "充电宝"),                     # the first mentioned
    ("屏幕碎了", "屏幕"),
    ("我的laptop坏了", "laptop"),                     # English goods in a Chinese message
])
def test_product(text: str, product: str) -> None:
    assert extract(text, "en")["product"] == product
    assert extract(text, "zh")["product"] == product  # the language does not narrow the vocabulary


@pytest.mark.parametrize("text", ["a xylophone", "fantastic service", "the bank called", "watchful", "hello", "你好"])
def test_no_product(text: str) -> None:
    assert "product" not in extract(text, "en")


def test_all_slots_in_order_as_written() -> None:
    text = "I paid $45.50 for the Power Bank, order no. 123456"
    assert extract(text, "en") == {"order_id": "123456", "product": "Power Bank", "amount": "$45.50"}
    assert tuple(extract(text, "en")) == SLOT_NAMES
    zh = "我的笔记本电脑坏了，花了2999元，订单号：2024113005"
    assert extract(zh, "zh") == {"order_id": "2024113005", "product": "笔记本电脑", "amount": "2999元"}


def test_spans_survive_a_character_that_lowers_to_two() -> None:
    # "İ".lower() is two characters; the values must still be cut from the right place.
    assert extract("İİ PHONE order 58213 $45", "en") == {"order_id": "58213", "product": "PHONE", "amount": "$45"}


_FRAGMENTS = ["order", " ", "#", "no.", "订单号", "是", "58213", "2024113005", "1", ",", ".", "$", "¥", "元", "dollars",
              "phone", "PHONES", "power bank", "笔记本电脑", "屏幕", "screen", "İ", "?", "那", "呢", "and", "it", "\n"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.lists(st.sampled_from(_FRAGMENTS), max_size=60).map("".join),
       st.sampled_from(["en", "zh", "other"]))
def test_values_are_bounded_substrings(text: str, lang: str) -> None:
    slots = extract(text, lang)
    assert set(slots) <= set(SLOT_NAMES)
    for value in slots.values():
        assert value and value in text and len(value) <= MAX_SLOT_CHARS
    assert isinstance(is_follow_up(text, lang), bool)


_BIG = 32_768


@pytest.mark.parametrize(("text", "slots"), [
    ("1" * _BIG, {}),                                               # one run far too long for an order id
    (("order " * _BIG)[:_BIG], {}),
    ("order #" * (_BIG // 7) + "58213", {"order_id": "58213"}),
    (("# " * _BIG)[:_BIG], {}),
    (("12345 " * _BIG)[:_BIG], {"order_id": "12345"}),
    (("1," * _BIG)[:_BIG], {}),
    (("$1," * _BIG)[:_BIG], {"amount": "$1"}),
    (("phones" * _BIG)[:_BIG], {}),                                 # never a word boundary
    (("订单号是" * _BIG)[:_BIG], {}),
    ("a" * _BIG + " phone", {"product": "phone"}),
])
def test_hostile_32k_inputs_stay_correct(text: str, slots: dict[str, str]) -> None:
    assert extract(text, "en") == slots
    assert extract(text, "zh") == slots
    assert not is_follow_up(text, "en")
    assert not is_follow_up(text, "zh")


def test_a_long_message_is_judged_by_its_opening() -> None:
    assert is_follow_up("and also " + "x" * _BIG, "en")
    assert is_follow_up("那" + "个" * _BIG + "呢", "zh")
    assert not is_follow_up("is it " + "x" * _BIG + "?", "en")  # not a short question


@pytest.mark.parametrize("text", [
    # A slot-only reply.
    "order 58213", "Order #58213.", "my order number is 58213", "#2024113005", "It's 58213", "58213 and 58214",
    "the laptop", "$45",
    # An elliptical question opening with a connective.
    "and if I lost the invoice?", "what about the other one?", "How about the blue one?", "what if it arrives broken?",
    "also, can I pay by card?", "but I never got it", "Or should I wait?",
    # A very short question with a pronoun referring back.
    "how long will that take?", "can you do that?", "is it free?", "Can I return it?", "does this come in red?",
])
def test_follow_up_en(text: str) -> None:
    assert is_follow_up(text, "en")


@pytest.mark.parametrize("text", [
    # A slot-only reply.
    "订单号是58213", "我的订单号是 58213", "订单2024113005", "58213", "58213呢",
    # An elliptical question opening with a connective.
    "那发票丢了呢？", "如果发票丢了呢", "还有", "还有别的颜色吗？", "要多久？", "多久能到？", "那个呢",
    "另外，能开发票吗", "发票呢？",
    # A very short question with a pronoun referring back.
    "这个可以吗", "它防水吗？",
])
def test_follow_up_zh(text: str) -> None:
    assert is_follow_up(text, "zh")


@pytest.mark.parametrize("text", [
    "how do I change my shipping address?", "where is my order 58213?", "order 58213 has not arrived yet",
    "I want to return the headphones I bought last week", "Is there a fee for returns?", "That's great", "thanks",
    "hello", "So what is your return policy?", "My phone screen is cracked, can I get a refund for order 58213?",
    "", "   ", "?",
])
def test_not_follow_up_en(text: str) -> None:
    assert not is_follow_up(text, "en")


@pytest.mark.parametrize("text", [
    "我想退货", "手机坏了", "能退货吗？", "你好", "怎么还没到呢", "为什么我的订单还没发货呢？",
    "我的订单58213什么时候发货？", "我的耳机坏了，订单号58213，可以换一个吗？", "如果商品有质量问题可以退货吗",
])
def test_not_follow_up_zh(text: str) -> None:
    assert not is_follow_up(text, "zh")


def test_chinese_rules_follow_the_text_when_the_hint_is_wrong() -> None:
    assert is_follow_up("这个可以吗", "en")
    assert is_follow_up("那个呢", "other")
    assert not is_follow_up("我想退货", "en")

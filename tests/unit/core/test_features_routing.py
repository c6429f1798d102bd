"""Features and routing rules: pure, no services."""

from __future__ import annotations

import pytest

from pipeline.contracts.models import Request
from pipeline.contracts.topics import Tier
from pipeline.core import features
from pipeline.core.routing import TierHealth, in_sample, route, should_escalate


def feats(text: str = "hi", *, vip: bool = False, image: bool = False, lang: str | None = None) -> dict[str, object]:
    img = {"data": "iVBORw0KGgo=", "mime": "image/png"} if image else None
    req = Request(id="1", text=text or None, image=img, lang=lang)
    return features.extract(req, vip=vip, image_bytes=8 if image else 0)


@pytest.mark.parametrize(("text", "script"), [
    ("my card is lost", "en"),
    ("我的卡丢了", "zh"),
    ("我的iPhone卡丢了", "zh"),
    ("Привет", "other"),
    ("12345 !!", "none"),
    ("", "none"),
])
def test_script(text: str, script: str) -> None:
    assert features.script_of(text) == script


def test_cjk_tokens_count_characters_not_spaces() -> None:
    assert features.token_count("我的卡还没有收到") == 8
    assert features.token_count("my card has not arrived") == 5
    assert features.token_count("我的 card 丢了!") == 6
    assert feats("我的卡还没有收到")["chars"] == 8


def test_cues() -> None:
    f = feats("Why was I charged twice? This is unacceptable, refund me immediately")
    assert f["question"] and f["complaint"] and f["urgent"]
    f = feats("我的卡被盗刷了，怎么办？我要投诉")
    assert f["question"] and f["complaint"] and f["urgent"]
    assert not any(feats("thanks")[k] for k in ("question", "complaint", "urgent"))


def test_lang_hint_wins() -> None:
    assert feats("hello", lang="zh-CN")["lang"] == "zh"
    assert feats("你好")["lang"] == "zh"


def test_rules_in_order() -> None:
    assert route(feats("x" * 100, vip=True, image=True), 50) == route(feats(image=True), 50)
    assert route(feats(image=True), 50).tier is Tier.MULTIMODAL
    r = route(feats("short", vip=True), 50)
    assert (r.tier, r.reason) == (Tier.HEAVY, "vip")
    r = route(feats("x" * 51), 50)
    assert (r.tier, r.reason) == (Tier.HEAVY, "length")
    r = route(feats("x" * 50), 50)
    assert (r.tier, r.reason) == (Tier.LIGHT, "short")


def test_length_threshold_counts_a_chinese_character_as_three_english_ones() -> None:
    zh = "我" * 17  # 51 English-equivalent characters
    assert feats(zh)["chars"] == 17 and feats(zh)["length"] == 51
    assert route(feats(zh), 50).tier is Tier.HEAVY
    assert route(feats(zh[:16]), 50).tier is Tier.LIGHT
    # the design article's example of a message for the large model, and a longer one: heavy, as in English
    for text in ("我买的手机屏幕碎了，发票找不到了，能保修吗？",
                 "我上个月在你们店买的手机，屏幕昨天摔碎了，纸质发票也找不到了，请问还能保修吗？维修要多少钱？"):
        assert route(feats(text), 50) is route(feats("x" * 51), 50)
    assert route(feats("我的订单在哪里？"), 50).tier is Tier.LIGHT
    mixed = "iPhone 15 屏幕碎了"  # Latin counts 1 a character, Han 3
    assert feats(mixed)["length"] == len("iPhone 15 ") + 3 * 4


def test_a_record_written_before_length_is_routed_on_its_chars() -> None:
    old = {k: v for k, v in feats("x" * 51).items() if k != "length"}
    assert route(old, 50).tier is Tier.HEAVY  # type: ignore[arg-type]


def test_degradation_sends_heavy_bound_traffic_to_light() -> None:
    down = TierHealth(False, "slow")
    r = route(feats("x" * 100), 50, down)
    assert (r.tier, r.reason, r.degraded) == (Tier.LIGHT, "length:degraded_slow", True)
    r = route(feats("hi", vip=True), 50, down)
    assert (r.tier, r.degraded) == (Tier.LIGHT, True)
    assert route(feats(image=True), 50, down).tier is Tier.MULTIMODAL
    assert not route(feats("hi"), 50, down).degraded


def test_escalation_threshold() -> None:
    assert should_escalate(0.3, 0.5)
    assert not should_escalate(0.5, 0.5)
    assert not should_escalate(0.9, 0.0)


def test_in_sample_is_deterministic_and_near_rate() -> None:
    ids = [f"id-{i}" for i in range(20_000)]
    share = sum(in_sample(i, 0.1) for i in ids) / len(ids)
    assert 0.09 < share < 0.11
    assert [in_sample(i, 0.1) for i in ids[:100]] == [in_sample(i, 0.1) for i in ids[:100]]
    assert not any(in_sample(i, 0.0) for i in ids[:1000])

"""The demo's customer messages: the design article's cases, in English and Chinese."""

from __future__ import annotations

import base64
import io
from typing import Any

VIP_USER = "vip-alice"

# The design article's cases (电商智能客服), in English and Chinese: a price question for the light tier, the
# warranty question with a lost invoice that the heavy tier answers in writing, a VIP, a photo of a cracked screen,
# an order-tracking question with an order number, and a photo of an order page whose number OCR reads; then small
# talk and questions no shop answers (handed over to a person).
SAMPLES: list[dict[str, Any]] = [
    {"id": "demo-01", "user_id": "u-1001", "case": "price", "text": "How much is this phone?"},
    {"id": "demo-02", "user_id": "u-1002", "case": "price", "text": "这个手机多少钱"},
    {"id": "demo-03", "user_id": "u-1003", "case": "warranty",
     "text": "I bought a phone from you last month and now the screen is cracked. I can't find the paper invoice "
             "anywhere. Is it still covered by the warranty?"},
    {"id": "demo-04", "user_id": "u-1004", "case": "warranty", "text": "我买的手机屏幕碎了，发票找不到了，能保修吗"},
    {"id": "demo-05", "user_id": VIP_USER, "case": "vip", "text": "I want my money back for the headphones"},
    {"id": "demo-06", "user_id": VIP_USER, "case": "vip", "text": "耳机不想要了，我要退款"},
    {"id": "demo-07", "user_id": "u-1007", "case": "photo", "text": "My phone screen is cracked, see the photo",
     "image": "CRACKED_SCREEN"},
    {"id": "demo-08", "user_id": "u-1008", "case": "photo", "text": "手机屏幕摔碎了，看图", "image": "CRACKED_SCREEN"},
    {"id": "demo-09", "user_id": "u-1009", "case": "order", "text": "Where is my order #58213?"},
    {"id": "demo-10", "user_id": "u-1010", "case": "order", "text": "我的订单58213到哪了？"},
    {"id": "demo-11", "user_id": "u-1011", "case": "order photo", "text": "has this one shipped yet?",
     "image": "ORDER_PAGE"},
    {"id": "demo-12", "user_id": "u-1012", "case": "vague", "text": "hmm my thing"},
    # 闲聊 and what no shop answers: small talk gets a short reply from light; an off-topic question goes to a person
    {"id": "demo-13", "user_id": "u-1013", "case": "chit-chat", "text": "thanks, you've been very helpful!"},
    {"id": "demo-14", "user_id": "u-1014", "case": "chit-chat", "text": "你好呀"},
    {"id": "demo-15", "user_id": "u-1015", "case": "off-topic",
     "text": "Can you help me fill in my tax return? I don't understand the form."},
    {"id": "demo-16", "user_id": "u-1016", "case": "off-topic", "text": "明天北京会下雨吗"},
]


def render_cracked_screen(size: tuple[int, int] = (240, 420)) -> bytes:
    """A PNG of a phone whose screen is cracked (no text on it: what a customer photographs)."""
    from PIL import Image, ImageDraw

    w, h = size
    img = Image.new("RGB", size, (235, 235, 235))
    draw = ImageDraw.Draw(img)
    draw.rounded_rectangle((20, 10, w - 20, h - 10), radius=28, fill=(30, 30, 30))
    draw.rectangle((34, 50, w - 34, h - 50), fill=(20, 40, 70))
    hit = (w * 0.62, h * 0.38)  # the impact point, with cracks running out of it
    for end in ((40, 60), (w - 40, 90), (50, h - 80), (w - 45, h - 60), (w / 2, h - 55), (34, h / 2)):
        mid = ((hit[0] + end[0]) / 2 + 9, (hit[1] + end[1]) / 2 - 7)
        draw.line((hit, mid, end), fill=(225, 230, 240), width=2)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def render_png(text: str, size: tuple[int, int] = (480, 160)) -> bytes:
    """A PNG of dark text on white (a stand-in for a customer's photo of a receipt or screen)."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    try:
        font: Any = ImageFont.load_default(size=40)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    draw.text((20, 50), text, fill="black", font=font)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


# Conversations: the second message means something only after the first (a follow-up, an order number alone).
# Each second turn is sent once the first is answered, as a customer would.
CONVERSATIONS: list[tuple[str, list[str]]] = [
    ("u-2001", ["I want to cancel order 58213", "do I lose any money then?"]),
    ("u-2002", ["我的耳机坏了，能修吗", "订单号是72073"]),
]


def requests() -> list[dict[str, Any]]:
    """The samples as request.v1 objects (images rendered and base64-encoded; `case` kept in `meta`)."""
    images = {"CRACKED_SCREEN": render_cracked_screen, "ORDER_PAGE": lambda: render_png("Order No. 58213",
                                                                                         (560, 160))}
    out = []
    for s in SAMPLES:
        req = dict(s)
        req["meta"] = {"case": req.pop("case")}
        if "image" in req:
            req["image"] = {"data": base64.b64encode(images[req["image"]]()).decode(), "mime": "image/png"}
        out.append(req)
    return out

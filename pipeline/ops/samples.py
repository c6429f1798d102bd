"""The demo's customer messages: English and Chinese, short and long, a VIP and one with a photo."""

from __future__ import annotations

import base64
import io
from typing import Any

VIP_USER = "vip-alice"

SAMPLES: list[dict[str, Any]] = [
    {"id": "demo-01", "user_id": "u-1001", "text": "My card still hasn't arrived"},
    {"id": "demo-02", "user_id": "u-1002", "text": "How do I reset my PIN?"},
    {"id": "demo-03", "user_id": "u-1003", "text": "Why was I charged a fee for a transfer?"},
    {"id": "demo-04", "user_id": "u-1004",
     "text": "I tried to pay for my groceries this morning and the card was declined twice even though "
             "I have plenty of money in my account. What is going on and how do I fix it?"},
    {"id": "demo-05", "user_id": "u-1005", "text": "I think someone stole my card and used it"},
    {"id": "demo-06", "user_id": "u-1006", "text": "我的卡还没有收到"},
    {"id": "demo-07", "user_id": "u-1007", "text": "转账为什么被收了手续费？"},
    {"id": "demo-08", "user_id": "u-1008",
     "text": "我昨天在国外的一家商店用卡付款，结果被拒绝了两次，可是我的账户里明明有足够的钱。"
             "请问这是怎么回事？我应该怎么处理才能正常使用我的卡？"},
    {"id": "demo-09", "user_id": VIP_USER, "text": "Can I get a refund for this purchase?"},
    {"id": "demo-10", "user_id": "u-1010", "text": "hmm my thing"},
    {"id": "demo-11", "user_id": "u-1011", "text": "My phone screen is cracked, see the photo", "image": "SCREEN"},
    {"id": "demo-12", "user_id": "u-1012", "text": "What exchange rate do you use?"},
]


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


def requests() -> list[dict[str, Any]]:
    """The samples as request.v1 objects (images rendered and base64-encoded)."""
    out = []
    for s in SAMPLES:
        req = dict(s)
        if "image" in req:
            req["image"] = {"data": base64.b64encode(render_png("SCREEN CRACKED")).decode(), "mime": "image/png"}
        out.append(req)
    return out

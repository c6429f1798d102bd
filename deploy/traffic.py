"""Live traffic for sizing: a steady rate of customer messages to the requests topic, while deploy/resources.py
measures.

    tierflow up &
    python deploy/traffic.py --rate 12 --seconds 150 &
    python deploy/resources.py --seconds 120

The mix is the packaged data of the default e-commerce pack (workers/data): 75% English Bitext test questions,
20% tierflow's Chinese shop messages, 5% photos with a line of text (an order number on a white card: the OCR
tier's work). The broker
and topic prefix come from the settings (`TIERFLOW_KAFKA_BOOTSTRAP`, `TIERFLOW_TOPIC_PREFIX`), as for `tierflow
send`. Each message carries `ts`, so the answers' end-to-end times mean what they say.
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "workers" / "data"
SHARES = {"photo": 0.05, "zh": 0.20}  # the rest English


def photo_png(text: str) -> str:
    """A PNG of one line of black text on white, base64 (the request's image.data)."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (480, 120), "white")
    ImageDraw.Draw(im).text((10, 40), text, fill="black")
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def texts(data: Path = DATA) -> tuple[list[str], list[str]]:
    """(English, Chinese) customer messages from the packaged data."""
    import orjson

    with (data / "bitext" / "test.csv").open(newline="", encoding="utf-8") as f:
        en = [row["text"] for row in csv.DictReader(f)]
    zh = [orjson.loads(line)["text"] for line in (data / "ecommerce" / "train_zh.jsonl").read_text(
        encoding="utf-8").splitlines() if line.strip()]
    return en, zh


def mix(n: int, en: list[str], zh: list[str], seed: int = 7, photos: list[str] | None = None) -> list[dict[str, Any]]:
    """`n` requests (request.v1, without ids and ts) in the shares above; `photos`: base64 PNGs to cycle through."""
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        x = rnd.random()
        if x < SHARES["photo"] and photos:
            out.append({"text": "the parcel arrived like this", "image": {"mime": "image/png",
                                                                         "data": photos[i % len(photos)]}})
        elif x < SHARES["photo"] + SHARES["zh"]:
            out.append({"text": rnd.choice(zh), "lang": "zh"})
        else:
            out.append({"text": rnd.choice(en)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=12.0, help="messages per second (12)")
    ap.add_argument("--seconds", type=float, default=150.0, help="how long to send (150)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0:
        sys.exit("deploy/traffic.py: --rate and --seconds must be > 0")
    sys.path.insert(0, str(ROOT))
    import orjson

    from pipeline.adapters.kafka import check_reachable, make_producer, topics_of
    from pipeline.errors import TierflowError
    from pipeline.settings import get_settings

    s = get_settings()
    try:
        check_reachable(s.kafka.servers, "Kafka")
    except TierflowError as e:
        sys.exit(f"deploy/traffic.py: {e}")
    en, zh = texts()
    rnd = random.Random(args.seed)
    photos = [photo_png(f"ORDER {rnd.randint(10000, 99999)} ARRIVED DAMAGED") for _ in range(20)]
    reqs = mix(max(1, int(args.rate * args.seconds)), en, zh, args.seed, photos)
    producer = make_producer(s)
    topic = topics_of(s).requests
    run = f"{int(time.time()):x}"
    t0 = time.monotonic()
    sent = 0
    for req in reqs:
        rid = f"traffic-{run}-{sent}"
        producer.produce(topic, orjson.dumps({**req, "id": rid, "ts": int(time.time() * 1000)}), key=rid)
        producer.poll(0)
        sent += 1
        ahead = sent / args.rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    left = producer.flush(30)
    print(f"sent {sent - left} messages to {topic} in {time.monotonic() - t0:.0f} s ({args.rate:g}/s)"
          + (f"; {left} not acknowledged" if left else ""))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())

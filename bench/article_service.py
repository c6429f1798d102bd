"""The design article's service, written anew: one HTTP request at a time, light or large model per request.

The article's FastAPI example routes each request by length (<= 50 characters: the light model, else
the large one) and calls the model for that one request. Here the same packaged models serve behind
a single-threaded HTTP server (one request at a time, as its synchronous endpoint does), and the same
traffic goes through tierflow on the embedded stack. Reported: throughput at equal hardware (flat out)
and p95 latency at an equal offered load.

    python -m bench.article_service [--quick] [--write]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

from bench.common import SHOP_TEXTS, embedded_services, fresh_topics, missing_note, tail_percentiles, write_section
from bench.pipeline import measure, start_pipeline
from pipeline.adapters.kafka import topics_of
from pipeline.contracts.topics import Tier
from pipeline.core import features
from pipeline.settings import Settings
from workers.model import InferenceModel, Item

# The default pack's (e-commerce) customer messages, English and Chinese, two of six over 50 characters. Not
# bench.pipeline's banking texts: the shop's models rightly judge those out of scope and hand them to heavy.
TEXTS = SHOP_TEXTS


class ArticleService:
    """The article's per-request router in front of the two models."""

    LENGTH_THRESHOLD = 50  # the article's rule: longer than this many characters -> the large model

    def __init__(self, light: InferenceModel, heavy: InferenceModel, length_threshold: int = LENGTH_THRESHOLD) -> None:
        self.light, self.heavy, self.length_threshold = light, heavy, length_threshold

    def answer(self, text: str) -> dict[str, object]:
        lang = features.lang_of(features.script_of(text), None)
        model = self.light if len(text) <= self.length_threshold else self.heavy
        pred = model.predict([Item(text, lang)])[0]
        return {"intent": pred.intent, "confidence": pred.confidence, "answer": pred.answer, "model": pred.model}


def serve(service: ArticleService) -> tuple[HTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps(service.answer(body["text"])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)  # one request at a time, as the article's sync endpoint
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


def call(port: int, text: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/infer", json.dumps({"text": text}), {"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()
    return (time.perf_counter() - t0) * 1000


def flat_out(port: int, n: int, clients: int = 8) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda i: call(port, TEXTS[i % len(TEXTS)]), range(n)))
    return n / (time.perf_counter() - t0)


def fixed_load(port: int, rate: float, seconds: float) -> list[float]:
    """Open loop: a request every 1/rate s whatever the server's state; latency includes the wait."""
    n = int(rate * seconds)
    lat: list[float] = []
    with ThreadPoolExecutor(256) as pool:
        futs = []
        t0 = time.perf_counter()
        for i in range(n):
            ahead = i / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
            futs.append(pool.submit(call, port, TEXTS[i % len(TEXTS)]))
        lat = [f.result() for f in futs]
    return lat


def long_share(texts: list[str], threshold: int = 50) -> tuple[int, float]:
    """How many of `texts` are longer than `threshold` characters (the article's rule sends them to
    the large model), and their share of the traffic when the texts are sent in turn."""
    long = sum(len(t) > threshold for t in texts)
    return long, long / len(texts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--rate", type=float, default=50.0, help="offered load for the p95 comparison (msg/s)")
    ap.add_argument("--messages", type=int, default=None, help="flat-out requests to the article service "
                                                                 "(2,000; quick 300); tierflow gets 5x as many")
    ap.add_argument("--seconds", type=float, default=None, help="length of the fixed-load runs (20 s; quick 5 s)")
    args = ap.parse_args()
    n = args.messages or (300 if args.quick else 2000)
    seconds = args.seconds or (5 if args.quick else 20)

    from workers.models.registry import tier_model

    models = Settings()
    light, heavy = tier_model(models, Tier.LIGHT), tier_model(models, Tier.HEAVY)
    light.setup("cpu")
    heavy.setup("cpu")
    server, port = serve(ArticleService(light, heavy))
    art_rate = flat_out(port, n)
    art_lat = fixed_load(port, args.rate, seconds)
    server.shutdown()
    del light, heavy

    with embedded_services() as services:
        s = fresh_topics(services)
        stack, _ = start_pipeline(s, {}, light_workers=1)
        try:
            t = topics_of(s)
            tf_flat = measure(s, t.requests, t.answers, n * 5, None, 600, texts=TEXTS)
            tf_fixed = measure(s, t.requests, t.answers, int(args.rate * seconds), args.rate, 300, texts=TEXTS)
        finally:
            stack.stop()
    art_cells = " | ".join(f"{v:.1f}" for v in tail_percentiles(art_lat, 0) if v is not None)  # all answered
    long, share = long_share(TEXTS, ArticleService.LENGTH_THRESHOLD)
    missing = missing_note({"tierflow flat out": tf_flat, "tierflow fixed load": tf_fixed})
    body = (
        f"Same packaged models (the default e-commerce pack), same messages ({len(TEXTS)} shop customer messages "
        f"in turn, English and Chinese; {long} of {len(TEXTS)}, {share:.0%} of the traffic, over "
        f"{ArticleService.LENGTH_THRESHOLD} "
        "characters, which the article's rule sends to the large model), same 2 cores. Each tierflow run waits "
        "for every one of its own answers; its percentiles are over all of them.\n\n"
        "| system | throughput flat out (msg/s) | load | p50 ms | p95 ms | p99 ms |\n|---|---:|---|---:|---:|---:|\n"
        f"| article service (one request at a time) | {art_rate:,.1f} | {args.rate:.0f} msg/s | {art_cells} |\n"
        f"| tierflow (micro-batched tiers on Kafka) | {tf_flat.rate:,.1f} | {args.rate:.0f} msg/s | "
        + " | ".join(tf_fixed.cells()) + " |\n\n"
        + (f"{missing}\n\n" if missing else "")
        + f"Throughput ratio tierflow / article service: {tf_flat.rate / art_rate:.1f}x "
        f"(tierflow answered {tf_flat.answered:,} of {tf_flat.sent:,} flat out). "
        f"1-minute load average at the end: {os.getloadavg()[0]:.1f}.\n"
    )
    print(body)
    if args.write:
        write_section("Against the design article's service", body)


if __name__ == "__main__":
    main()

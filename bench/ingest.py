"""Ingest throughput against the bare confluent-kafka consume-and-produce loop, same messages, same run.

The bare loop is the physical limit here: consume a batch, produce every record unchanged to one
topic, flush, commit. The ingest agent does the same plus validation, features, routing and the
routed envelope. Also times the routing decision alone (features + rules) per message.

    python bench/ingest.py [--messages 200000] [--write]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid

import orjson

from bench.common import embedded_services, fresh_topics, write_section
from pipeline.adapters.kafka import make_consumer, make_producer, next_offsets, produce, topics_of
from pipeline.agents.ingest import Ingest
from pipeline.contracts.models import decode_request
from pipeline.core import features
from pipeline.core.routing import route
from pipeline.settings import Settings

TEXTS = [
    "My card has not arrived yet", "How do I reset my PIN?", "Why was I charged a fee for this transfer?",
    "I was charged twice for the same purchase at the supermarket yesterday, please refund one of them",
    "我的卡还没有收到", "转账为什么被收了手续费？", "What exchange rate do you use for euros?",
]


def requests(n: int) -> list[bytes]:
    rnd = random.Random(7)
    return [orjson.dumps({"id": f"b-{i}", "text": rnd.choice(TEXTS), "user_id": f"u{rnd.randrange(5000)}",
                          "ts": 1_700_000_000_000 + i}) for i in range(n)]


def fill(s: Settings, topic: str, msgs: list[bytes]) -> None:
    p = make_producer(s, **{"linger.ms": 20})
    for i, m in enumerate(msgs):
        produce(p, topic, m, key=str(i % 5000))
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)


def bare_loop(s: Settings, src: str, dst: str, n: int, batch: int) -> float:
    """Consume-produce-flush-commit with no processing; returns msg/s."""
    c = make_consumer(s, f"bare-{uuid.uuid4().hex[:6]}")
    p = make_producer(s)
    c.subscribe([src])
    done, t0 = 0, 0.0
    while done < n:
        msgs = c.consume(batch, 1.0)
        if not msgs:
            continue
        if not t0:
            t0 = time.perf_counter()
        for m in msgs:
            produce(p, dst, m.value() or b"", m.key())
        p.flush(30)
        c.commit(offsets=next_offsets(msgs), asynchronous=False)
        done += len(msgs)
    rate = done / (time.perf_counter() - t0)
    c.close()
    return rate


def ingest_loop(s: Settings, n: int) -> float:
    agent = Ingest(s, health_checks=False)
    agent.cache.start()
    agent.consumer.subscribe([agent.topics.requests])
    done, t0 = 0, 0.0
    while done < n:
        k = agent.step(timeout=1.0)
        if k and not t0:
            t0 = time.perf_counter()
        done += k
    rate = done / (time.perf_counter() - t0)
    agent.close()
    return rate


def route_us(msgs: list[bytes]) -> tuple[float, float]:
    """Microseconds per message: (features + rules) and (validation + features + rules)."""
    reqs = [decode_request(m, 10**7) for m in msgs]
    t0 = time.perf_counter()
    for q in reqs:
        route(features.extract(q, vip=False), 50)
    decide = (time.perf_counter() - t0) / len(reqs) * 1e6
    t0 = time.perf_counter()
    for m in msgs:
        q = decode_request(m, 10**7)
        route(features.extract(q, vip=False), 50)
    full = (time.perf_counter() - t0) / len(msgs) * 1e6
    return decide, full


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="alternating bare/ingest rounds (median reported)")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--quick", action="store_true", help="50,000 requests, one round")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.rounds = 50_000, 1

    with embedded_services() as base:
        msgs = requests(args.messages)
        decide_us, full_us = route_us(msgs[:20_000])
        bare, ing = [], []
        for r in range(args.rounds):
            s = fresh_topics(base)
            t = topics_of(s)
            fill(s, t.requests, msgs)
            bare.append(bare_loop(s, t.requests, t.labels, len(msgs), s.ingest.batch))
            ing.append(ingest_loop(s, len(msgs)))
            print(f"round {r + 1}: bare {bare[-1]:,.0f} msg/s, ingest {ing[-1]:,.0f} msg/s")
    b, i = statistics.median(bare), statistics.median(ing)
    body = (
        f"{args.messages:,} requests (English and Chinese, 30-120 bytes of text), one process each, "
        f"median of {args.rounds} alternating rounds on the embedded broker.\n\n"
        "| loop | msg/s | vs bare |\n|---|---:|---:|\n"
        f"| bare consume → produce → flush → commit | {b:,.0f} | 100% |\n"
        f"| ingest agent (validate, features, route, envelope) | {i:,.0f} | {i / b:.0%} |\n\n"
        f"Routing decision alone (features + rules): {decide_us:.2f} µs/message; "
        f"with schema validation: {full_us:.2f} µs/message.\n"
    )
    print(body)
    if args.write:
        write_section("Ingest", body)


if __name__ == "__main__":
    main()

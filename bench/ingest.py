"""Ingest throughput against a bare loop doing the same Kafka work, same messages, same run.

The bare loop is the physical limit of one process here: it consumes the same requests in batches of the same
size, produces for each the record ingest would write (same bytes, same tier topic: looked up in a table built
before the clock starts), with the same producer settings, then flushes and commits as ingest does. What ingest
adds per message is only its own work: parse and validate the JSON, features, the routing decision, the envelope.
Both clocks start after each loop's first batch is done (connection, assignment and the first fetch are not
timed) and count only the messages after it; rounds alternate which loop goes first. Run per producer codec
(the product's default lz4, and none). Also times the routing decision alone (features + rules) per message.

    python -m bench.ingest [--messages 200000] [--rounds 3] [--codecs lz4,none] [--write]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections import Counter

import orjson

from bench.common import drop_topics, embedded_services, fresh_topics, write_section
from pipeline.adapters.batches import BatchCommitter
from pipeline.adapters.dlq import DeadLetters
from pipeline.adapters.kafka import DeliveryTracker, make_member, make_producer, poll_batch, produce, topics_of
from pipeline.agents.ingest import Ingest
from pipeline.contracts.records import RoutedBatch, fast_request
from pipeline.core import features
from pipeline.core.routing import HEALTHY, route
from pipeline.core.thresholds import Thresholds
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


def outputs(s: Settings, msgs: list[bytes]) -> dict[bytes, tuple[str, bytes]]:
    """What ingest writes for each request: (tier topic, routed record), as its hot path builds it."""
    th, topics, now_ms = Thresholds(), topics_of(s), int(time.time() * 1000)
    batch = RoutedBatch(th.version, th.escalate_below, now_ms, th.abstain_above, th.handover_above)
    out = {}
    for raw in msgs:
        d = fast_request(raw)
        assert d is not None, "the bench's requests are plain text requests"
        feats = features.extract_fields(d["text"], d.get("lang"), False, 0, False)
        r = route(feats, th.length_threshold, HEALTHY)
        value = batch.dump(raw, RoutedBatch.features(feats), now_ms, RoutedBatch.route(r.tier, r.reason, r.degraded))
        out[raw] = (topics.tier(r.tier), value)
    return out


def bare_loop(s: Settings, src: str, table: dict[bytes, tuple[str, bytes]], n: int) -> float:
    """Ingest's Kafka work without its per-message work: a member consumer, batches of `ingest.batch` taken as
    ingest takes them, each request's routed record (from `table`) produced to its tier topic by a producer set
    up as ingest's, then the same flush-and-commit (BatchCommitter). Returns msg/s after the first batch."""
    c = make_member(s, s.group(f"bare-{uuid.uuid4().hex[:6]}"))
    delivery = DeliveryTracker()
    p = make_producer(s, on_delivery=delivery, **{"delivery.report.only.error": True})
    committer = BatchCommitter(c, p, delivery, DeadLetters(s, "bare"), "bare", s.flush_timeout_s)
    c.subscribe([src])
    done, first, t0 = 0, 0, 0.0
    while done < n:
        msgs = c.consume(s.ingest.batch, 0) or poll_batch(c, s.ingest.batch, 1.0)
        if not msgs:
            continue
        produce_ = p.produce
        for m in msgs:
            topic, value = table[m.value() or b""]
            try:
                produce_(topic, value, m.key())
            except BufferError:
                produce(p, topic, value, m.key())
        committer.finish(msgs)
        done += len(msgs)
        if not t0:
            first, t0 = done, time.perf_counter()
    rate = (done - first) / (time.perf_counter() - t0)
    c.close()
    return rate


def ingest_loop(s: Settings, n: int) -> float:
    """The ingest agent's own loop (`step`), health checks off; msg/s after its first batch."""
    agent = Ingest(s, health_checks=False)
    agent.cache.start()
    agent.consumer.subscribe([agent.topics.requests])
    done, first, t0 = 0, 0, 0.0
    while done < n:
        done += agent.step(timeout=1.0)
        if done and not t0:
            first, t0 = done, time.perf_counter()
    rate = (done - first) / (time.perf_counter() - t0)
    agent.close()
    return rate


def work_us(msgs: list[bytes]) -> tuple[float, float]:
    """Microseconds per message of ingest's hot path without Kafka: (features and rules on a parsed request) and
    (parse and validate, features, rules, the routed record)."""
    th = Thresholds()
    batch = RoutedBatch(th.version, th.escalate_below, 0, th.abstain_above, th.handover_above)
    extract = features.extract_fields
    parsed = [d for d in map(fast_request, msgs) if d is not None]
    t0 = time.perf_counter()
    for d in parsed:
        route(extract(d["text"], d.get("lang"), False, 0, False), th.length_threshold)
    decide = (time.perf_counter() - t0) / len(msgs) * 1e6
    t0 = time.perf_counter()
    for m in msgs:
        q = fast_request(m)
        assert q is not None
        f = extract(q["text"], q.get("lang"), False, 0, False)
        r = route(f, th.length_threshold)
        batch.dump(m, RoutedBatch.features(f), 0, RoutedBatch.route(r.tier, r.reason, r.degraded))
    full = (time.perf_counter() - t0) / len(msgs) * 1e6
    return decide, full


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per codec, alternating which loop goes first "
                                                          "(median reported)")
    ap.add_argument("--codecs", default="lz4,none", help="producer compression, comma list (lz4: the default)")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--quick", action="store_true", help="50,000 requests, one round")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.rounds = 50_000, 1

    msgs = requests(args.messages)
    decide_us, full_us = work_us(msgs[:20_000])
    rows = []
    with embedded_services() as base:
        for codec in args.codecs.split(","):
            bare, ing = [], []
            for r in range(args.rounds):
                s = fresh_topics(base, backlog=True).updated(kafka_compression=codec)
                t = topics_of(s)
                table = outputs(s, msgs)  # this round's topic names
                fill(s, t.requests, msgs)
                order = ("bare", "ingest") if r % 2 == 0 else ("ingest", "bare")
                for loop in order:
                    if loop == "bare":
                        bare.append(bare_loop(s, t.requests, table, len(msgs)))
                    else:
                        ing.append(ingest_loop(s, len(msgs)))
                print(f"{codec} round {r + 1} ({' then '.join(order)}): bare {bare[-1]:,.0f} msg/s, "
                      f"ingest {ing[-1]:,.0f} msg/s")
                drop_topics(s)
            rows.append((codec, statistics.median(bare), statistics.median(ing)))
    # the records are the same every round (only the topic prefix differs): the last round's table describes all
    sizes = Counter(topic.rsplit(".", 1)[-1] for topic, _ in table.values())
    out_bytes = statistics.mean(len(v) for _, v in table.values())
    in_bytes = statistics.mean(len(m) for m in msgs)
    share = ", ".join(f"{n / len(msgs):.0%} {tier}" for tier, n in sorted(sizes.items()))
    body = (
        f"{args.messages:,} requests (English and Chinese, {in_bytes:.0f} bytes on average), one process per loop, "
        f"median of {args.rounds} rounds per codec, alternating which loop goes first, on the embedded broker. "
        f"Both loops consume batches of the same size, write the same routed records ({out_bytes:.0f} bytes on "
        f"average; {share}) to the same tier topics with the same producer settings, and flush and commit alike; "
        "the bare loop looks each record up in a table built before its clock starts. Clocks start after each "
        "loop's first batch.\n\n"
        "| producer codec | bare loop msg/s | ingest msg/s | ingest / bare |\n|---|---:|---:|---:|\n"
        + "".join(f"| {codec}{' (default)' if codec == Settings().kafka.compression else ''} | {b:,.0f} | "
                  f"{i:,.0f} | {i / b:.0%} |\n" for codec, b, i in rows)
        + f"\nWhat ingest adds per message, timed alone without Kafka: parsing and validating the JSON, features, "
          f"the routing decision and the routed record {full_us:.2f} µs (features and rules alone on a parsed "
          f"request: {decide_us:.2f} µs).\n"
    )
    print(body)
    if args.write:
        write_section("Ingest", body)


if __name__ == "__main__":
    main()

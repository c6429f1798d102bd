"""Does a consumer reading at the log's end see every record, with several producers writing one partition?

Per embedded broker: `--producers` producers (as tierflow's workers write the answers topic) each send `--per`
records at `--rate`/s into a 4-partition topic, while two consumers read it as it grows: a plain librdkafka
Consumer, and tierflow's `OrderedConsumer` (pipeline/adapters/kafka.py). Then the whole topic is read again from
the beginning. A record the second read finds and a tailing consumer never saw was skipped by that consumer;
a jump is a record delivered at an offset past the one its partition was expected at. Repeated `--runs` times.

    python -m bench.ordering [--producers 6] [--per 10000] [--rate 800] [--runs 3] [--write]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import Consumer, KafkaError, Message
from confluent_kafka.admin import NewTopic

from bench.common import run_dir, write_section
from pipeline.adapters.brokers import BrokerName
from pipeline.adapters.kafka import OrderedConsumer, Tail, consumer_config, make_admin, make_consumer, make_producer
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings

PARTITIONS = 4


@dataclass
class Tailer:
    """A consumer reading the topic as it is written: what it saw, and its jumps past an expected offset."""

    consumer: Consumer
    seen: set[bytes] = field(default_factory=set)
    jumps: int = 0
    _next: dict[int, int] = field(default_factory=dict)

    def take(self, msgs: list[Message]) -> None:
        for m in msgs:
            off, p = m.offset(), m.partition() or 0
            if m.error() is not None or off is None:
                continue
            if p in self._next and off > self._next[p]:
                self.jumps += 1
            self._next[p] = off + 1
            self.seen.add(m.value() or b"")


@dataclass
class Outcome:
    acked: int
    plain_skipped: int
    plain_jumps: int
    ordered_skipped: int
    ordered_jumps: int
    healed: int
    passed: int


class Writers:
    """`producers` producers, each writing `per` records at `rate`/s into `topic` from a thread of its own, as
    tierflow's workers write the answers topic; `acked`: the values the broker acknowledged."""

    def __init__(self, s: Settings, topic: str, producers: int, per: int, rate: float) -> None:
        self.s, self.topic, self.per, self.rate = s, topic, per, rate
        self.acked: set[bytes] = set()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(producers)]

    def start(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self) -> None:
        for t in self._threads:
            t.join()

    def _run(self, i: int) -> None:
        p = make_producer(self.s)

        def cb(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                with self._lock:
                    self.acked.add(msg.value() or b"")
        t0 = time.monotonic()
        for n in range(self.per):
            p.produce(self.topic, f"p{i}-{n}".encode(), key=f"k{n % 97}".encode(), on_delivery=cb)
            p.poll(0)
            ahead = (n + 1) / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        p.flush(60)


def run_once(s: Settings, producers: int, per: int, rate: float) -> Outcome:
    topic = f"ord-{uuid.uuid4().hex[:6]}"
    admin = make_admin(s)  # kept: a collected AdminClient fails its own futures
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    plain = Tailer(Consumer(consumer_config(s, f"plain-{topic}")))  # the same settings, no guard
    ordered = Tailer(make_consumer(s, f"ordered-{topic}"))
    stop = threading.Event()

    def tail(t: Tailer) -> None:
        t.consumer.subscribe([topic])
        while not stop.is_set():
            t.take(t.consumer.consume(2000, 0.2))

    readers = [threading.Thread(target=tail, args=(t,), daemon=True) for t in (plain, ordered)]
    for r in readers:
        r.start()
    time.sleep(3)  # both joined before the first record
    writers = Writers(s, topic, producers, per, rate).start()
    writers.join()
    acked = writers.acked
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not acked <= ordered.seen:
        time.sleep(0.5)
    time.sleep(3)  # the plain consumer never comes back for what it skipped: a moment for its last fetch
    stop.set()
    for r in readers:
        r.join(10)
    guard = cast(OrderedConsumer, ordered.consumer).guard
    plain.consumer.close()
    ordered.consumer.close()
    stored = read_all(s, topic)
    assert acked <= stored, f"{len(acked - stored)} acknowledged records not stored: not what this bench measures"
    return Outcome(len(acked), len(acked - plain.seen), plain.jumps, len(acked - ordered.seen), ordered.jumps,
                   guard.healed, guard.passed)


def read_all(s: Settings, topic: str) -> set[bytes]:
    """Every record of `topic`, read from the beginning once the producers are done."""
    tail = Tail(s, topic, start="beginning")
    seen: set[bytes] = set()
    deadline = time.monotonic() + 120
    try:
        while not tail.caught_up and time.monotonic() < deadline:
            seen.update(m.value() or b"" for m in tail.poll(0.5, 10_000))
    finally:
        tail.close()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=6)
    ap.add_argument("--per", type=int, default=10000, help="records per producer")
    ap.add_argument("--rate", type=float, default=800.0, help="records/s per producer")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--brokers", default="noida,tansu")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = ["| broker | run | acknowledged | plain consumer: skipped | its jumps | OrderedConsumer: skipped | "
            "its jumps | gaps re-read and filled | gaps passed after the grace |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for broker in args.brokers.split(","):
        with run_dir(f"ordering-{broker}") as data:
            base = Settings(kafka_port=free_port(), redis_port=free_port(), data_dir=data,
                            embedded_broker=cast(BrokerName, broker))
            stack = Stack(base)
            stack.start_broker()
            try:
                s = stack.settings.updated(kafka_bootstrap=base.kafka.servers)
                for run in range(1, args.runs + 1):
                    o = run_once(s, args.producers, args.per, args.rate)
                    rows.append(f"| {broker} | {run} | {o.acked:,} | {o.plain_skipped:,} | {o.plain_jumps:,} | "
                                f"{o.ordered_skipped:,} | {o.ordered_jumps:,} | {o.healed:,} | {o.passed:,} |")
                    print(rows[-1], flush=True)
            finally:
                stack.stop()
    body = (f"{args.producers} producers, each {args.per:,} records at {args.rate:g}/s (acks=all, linger 2 ms), into "
            f"one {PARTITIONS}-partition topic, read as it is written by a plain librdkafka consumer and by "
            "tierflow's `OrderedConsumer`; then read again from the beginning. Skipped: acknowledged, stored (the "
            "second read finds it), and never delivered to that consumer. A jump: a record delivered past the "
            "offset its partition was expected at. On tansu the `OrderedConsumer` holds such a record back and "
            "reads the partition again from the expected offset (pipeline/core/ordering.py); elsewhere it is a "
            "plain consumer. Records a broker did not acknowledge (tansu slows as its log grows, and some time out) "
            "are not counted.\n\n" + "\n".join(rows) + "\n")
    print(body)
    if args.write:
        write_section("Reading at the log's end with concurrent producers", body)


if __name__ == "__main__":
    main()

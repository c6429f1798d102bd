"""What a broker restart keeps, per embedded broker: acknowledged records still there after a kill -9 or a SIGTERM.

For each (broker, storage, signal): a producer (acks=all) writes `--rate` records/s to a fresh topic for
`--seconds`, the broker is stopped with the signal mid-run and started again on the same storage, and every
acknowledged record is looked for. Also the committed offset of a consumer group that kept up.

    python -m bench.durability [--rate 1000] [--seconds 14] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from confluent_kafka import KafkaError, Message, TopicPartition
from confluent_kafka.admin import NewTopic

from bench.common import run_dir, write_section
from pipeline.adapters.brokers import BrokerName
from pipeline.adapters.kafka import make_admin, make_consumer, make_producer, next_offsets
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings


@dataclass
class Outcome:
    broker: str
    storage: str
    how: str
    acked: int
    kept: int
    offsets_kept: bool

    @property
    def lost(self) -> int:
        return self.acked - self.kept


def run(broker: str, durable: bool, sig: int, rate: float, seconds: float, root: Path) -> Outcome:
    base = Settings(kafka_port=free_port(), redis_port=free_port(), data_dir=root / f"{broker}-{durable}-{sig}",
                    embedded_broker=cast(BrokerName, broker), embedded_durable=durable)
    stack = Stack(base)
    stack.start_broker()
    s = stack.settings.updated(kafka_bootstrap=base.kafka.servers)
    try:
        topic, group = f"dur-{uuid.uuid4().hex[:6]}", f"dur-{uuid.uuid4().hex[:6]}"
        admin = make_admin(s)  # kept: a collected AdminClient fails its own futures
        admin.create_topics([NewTopic(topic, 4, 1)])[topic].result()
        acked: set[str] = set()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                acked.add((msg.key() or b"").decode())

        # A consumer that keeps up and commits every second: are its offsets there after the restart?
        c = make_consumer(s, group)
        c.subscribe([topic])
        stop = threading.Event()

        def consume() -> None:
            last, seen_msgs = time.monotonic(), []
            while not stop.is_set():
                seen_msgs += [m for m in c.consume(1000, 0.2) if m.error() is None]
                if seen_msgs and time.monotonic() - last > 1.0:
                    with contextlib.suppress(Exception):  # the broker is down for a moment: commit later
                        c.commit(offsets=next_offsets(seen_msgs), asynchronous=False)
                        seen_msgs = []
                    last = time.monotonic()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        p = make_producer(s, **{"linger.ms": 5, "message.timeout.ms": 60000})
        t0 = time.monotonic()
        n = int(rate * seconds)
        for i in range(n):
            p.produce(topic, os.urandom(200), key=str(i), on_delivery=on_delivery)
            p.poll(0)
            if i == n * 2 // 3:  # stop the broker two thirds in, with traffic flowing
                p.flush(10)
                stack.kill("broker", sig, timeout=60)
                stack.start_broker()
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        p.flush(60)
        stop.set()
        t.join(10)
        committed = c.committed([TopicPartition(topic, q) for q in range(4)], timeout=10)
        c.close()
        check = make_consumer(s, f"check-{uuid.uuid4().hex[:6]}")
        check.assign([TopicPartition(topic, q, 0) for q in range(4)])
        seen: set[str] = set()
        idle = time.monotonic()
        while time.monotonic() - idle < 5:
            msgs = check.consume(10000, 0.5)
            if msgs:
                idle = time.monotonic()
            seen.update((m.key() or b"").decode() for m in msgs if m.error() is None)
        check.close()
        storage = {"noida": "snapshot (--data)" if durable else "memory (fresh start)",
                   "tansu": "s3:// on SeaweedFS" if durable else "memory"}[broker]
        return Outcome(broker, storage, "kill -9" if sig == signal.SIGKILL else "SIGTERM", len(acked),
                       len(acked & seen), any(tp.offset > 0 for tp in committed))
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=14.0)
    ap.add_argument("--brokers", default="noida,tansu", help="embedded brokers to measure (noida,tansu)")
    ap.add_argument("--quick", action="store_true", help="5 s runs")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    seconds = 5.0 if args.quick else args.seconds
    plan = [("noida", True, signal.SIGKILL), ("noida", True, signal.SIGTERM), ("noida", False, signal.SIGTERM),
            ("tansu", True, signal.SIGKILL), ("tansu", False, signal.SIGKILL)]
    rows = ["| broker | storage | stopped by | acknowledged | still there after the restart | lost | "
            "consumer offsets kept |", "|---|---|---|---:|---:|---:|---|"]
    with run_dir("durability") as root:
        for broker, durable, sig in [x for x in plan if x[0] in args.brokers.split(",")]:
            o = run(broker, durable, sig, args.rate, seconds, root)
            rows.append(f"| {o.broker} | {o.storage} | {o.how} | {o.acked:,} | {o.kept:,} | {o.lost:,} | "
                        f"{'yes' if o.offsets_kept else 'no'} |")
            print(rows[-1], flush=True)
    body = (f"{args.rate:.0f} records/s of 200 bytes (acks=all) for {seconds:g} s into a 4-partition topic; the "
            "broker is stopped two thirds in and started again on the same storage; then every acknowledged "
            "record is looked for, and a consumer group that kept up (committing every second) checks its "
            "offsets.\n\n" + "\n".join(rows) + "\n")
    print(body)
    if args.write:
        write_section("What a broker restart keeps", body)


if __name__ == "__main__":
    main()

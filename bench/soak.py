"""`tierflow up` for a long while at a steady rate: the embedded broker's CPU and memory stay bounded.

Starts `tierflow up` as a user does (its own embedded broker and Valkey, every agent; echo models, so the
broker, not a model, is what is measured), sends `--rate` requests/s for `--minutes`, reads every answer back,
and every `--every` seconds writes down the broker process's CPU (% of one core) and RSS, the answers' p50/p99
and how many are still missing.

    python -m bench.soak [--minutes 30] [--rate 500] [--broker noida] [--write]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson

from bench.common import SHOP_TEXTS as TEXTS
from bench.common import write_section
from bench.pipeline import percentiles
from bench.sustained import cpu_seconds, rss_mib
from pipeline.adapters.kafka import Tail, make_producer, produce, topics_of
from pipeline.ops.devstack import free_port
from pipeline.settings import Settings

ECHO = {"TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_HEAVY_MODEL": "echo", "TIERFLOW_MULTIMODAL_MODEL": "echo",
        "TIERFLOW_ZH_MODEL": "", "TIERFLOW_HEAVY_DEVICE": "cpu"}


def children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def broker_pid(up: int, name: str) -> int:
    for pid in children(up):
        try:
            if name in Path(f"/proc/{pid}/cmdline").read_text():
                return pid
        except OSError:
            continue
    raise RuntimeError(f"no {name} process under tierflow up ({up})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--every", type=float, default=None, help="seconds per table row (300; under 10 minutes: 60)")
    ap.add_argument("--broker", default="noida")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    every = args.every or (300.0 if args.minutes >= 10 else max(5.0, args.minutes * 60 / 5))
    kport, rport = free_port(), free_port()
    data = Path(f".tierflow/bench-soak-{uuid.uuid4().hex[:6]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERFLOW_")}
    env.update(ECHO, TIERFLOW_KAFKA_PORT=str(kport), TIERFLOW_REDIS_PORT=str(rport), TIERFLOW_DATA_DIR=str(data),
               TIERFLOW_EMBEDDED_BROKER=args.broker)
    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert up.stdout is not None
    banner = []
    while True:
        line = up.stdout.readline()
        banner.append(line)
        if "Ctrl-C stops everything" in line or not line:
            break
    if up.poll() is not None:
        raise SystemExit("tierflow up did not start:\n" + "".join(banner))
    def drain() -> None:  # `up` keeps printing (restarts, warnings): a full pipe would block it
        for _ in up.stdout or []:
            pass

    threading.Thread(target=drain, daemon=True).start()
    bpid = broker_pid(up.pid, {"noida": "noida-db", "tansu": "tansu"}[args.broker])
    s = Settings(kafka_port=kport, redis_port=rport)
    tail = Tail(s, topics_of(s).answers, "end")
    read_at: dict[str, float] = {}
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for m in tail.poll(0.05, 5000):
                read_at.setdefault((m.key() or b"").decode(), time.time())

    threading.Thread(target=read, daemon=True).start()
    p = make_producer(s, **{"linger.ms": 1})
    sent_at: dict[str, float] = {}
    rows = ["| minute | sent | answered | missing | p50 ms | p99 ms | broker CPU % | broker RSS MiB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    t0 = time.monotonic()
    last_cpu, last_t, next_row, i = cpu_seconds(bpid), time.monotonic(), t0 + every, 0
    window: list[str] = []
    try:
        while time.monotonic() - t0 < args.minutes * 60:
            rid = f"soak-{i}"
            sent_at[rid] = time.time()
            window.append(rid)
            produce(p, topics_of(s).requests, orjson.dumps({"id": rid, "text": TEXTS[i % len(TEXTS)]}), key=rid)
            p.poll(0)
            i += 1
            ahead = i / args.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
            if time.monotonic() >= next_row:
                now = time.monotonic()
                cpu = 100 * (cpu_seconds(bpid) - last_cpu) / (now - last_t)
                last_cpu, last_t, next_row = cpu_seconds(bpid), now, next_row + every
                # the window before this one: its answers have had a whole window to arrive
                lat = [(read_at[r] - sent_at[r]) * 1000 for r in window if r in read_at]
                p50, _, p99 = percentiles(lat)
                missing = sum(1 for r in sent_at if r not in read_at and sent_at[r] < time.time() - 5)
                rows.append(f"| {(now - t0) / 60:.0f} | {len(sent_at):,} | {len(read_at):,} | {missing:,} | "
                            f"{p50:.1f} | {p99:.1f} | {cpu:.0f} | {rss_mib(bpid):.0f} |")
                print(rows[-1], flush=True)
                window = []
        p.flush(30)
        time.sleep(10)
    finally:
        stop.set()
        up.terminate()
        up.wait(90)
        tail.close()
    lost = sum(1 for r in sent_at if r not in read_at)
    body = (f"`tierflow up` (embedded {args.broker}, echo models) at {args.rate:.0f} requests/s for "
            f"{args.minutes:g} minutes, driven from outside: requests produced to the requests topic, answers read "
            f"back. Every {every / 60:g} minutes: latency of that window's requests, answers still missing after "
            "5 s, and the broker process's CPU (% of one core) and RSS.\n\n" + "\n".join(rows)
            + f"\n\nUnanswered at the end: {lost:,} of {len(sent_at):,}. 1-minute load average: "
            f"{os.getloadavg()[0]:.1f}.\n")
    print(body)
    if args.write:
        write_section(f"tierflow up for {args.minutes:g} minutes ({args.broker})", body)


if __name__ == "__main__":
    main()

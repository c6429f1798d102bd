"""Ingest against its peers: tierflow's ingest agent, the same work in Quix Streams and in faust-streaming.

Each runner reads the same N requests (bench/ingest.py's: English and Chinese, 30-120 bytes of text) from a
requests topic on the embedded broker and writes every one, routed, to its tier topic. All three do the same
per-message work by calling tierflow's own functions (bench/peers/work.py: validation, features, routing rules,
the routed envelope); what differs is the streaming runtime around it:

- tierflow: `pipeline.agents.ingest.Ingest` (confluent-kafka, a batch per consume(), flush and commit per batch);
- Quix Streams: an `Application`, `sdf.apply(route)`, `sdf.to_topic(select_topic)` (bench/peers/quix.py);
- faust-streaming: an `@app.agent` with `async for event in stream.events()` and `await topic.send()`
  (bench/peers/faust_ingest.py).

One process per runner per round (no shared state), rounds in alternating order (ABC, CBA, ...), fresh topics for
every run (filled before the runner starts; deleted after). After each run the end offsets of the tier topics and
the DLQ are counted: they must add up to N, split across the tiers the same way for every runner.
Reported: msg/s per runner (median of the rounds; first output to last output flushed) and tierflow / peer.

Quix runs in a virtualenv of its own (`.tierflow/peers/quix-venv`, made on first use from
bench/peers/requirements-quix.txt): quixstreams pins confluent-kafka < 2.13 and tierflow needs >= 2.16.

    python -m bench.peers [--messages 200000] [--rounds 3] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from bench.common import ROOT, embedded_services, fresh_topics, write_section
from bench.ingest import fill, requests
from bench.peers.work import Spec
from pipeline.adapters.kafka import Tail, delete_topics, topics_of
from pipeline.adapters.redis_client import make_redis
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings

TITLE = "Ingest against its peers: Quix Streams and faust"
RUNNERS = ("tierflow", "quix", "faust")
LABELS = {
    "tierflow": "tierflow ingest agent (confluent-kafka, batch → flush → commit)",
    "quix": "Quix Streams (`Application`, `sdf.apply` → `sdf.to_topic`)",
    "faust": "faust-streaming (`@app.agent`, `async for` → `topic.send`)",
}
MODULES = {"tierflow": "bench.peers.ingest_agent", "quix": "bench.peers.quix", "faust": "bench.peers.faust_ingest"}
REQUIREMENTS = Path(__file__).resolve().parent / "requirements-quix.txt"
QUIX_VENV = ROOT / ".tierflow" / "peers" / "quix-venv"


def pinned(requirements: Path = REQUIREMENTS) -> dict[str, str]:
    """name -> version of the `name==version` lines of a requirements file."""
    out = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def quix_python(explicit: str | None = None) -> str:
    """The interpreter of Quix's virtualenv: `explicit`, else `.tierflow/peers/quix-venv`, made (or brought to the
    pinned versions) from bench/peers/requirements-quix.txt when it is missing or differs."""
    if explicit:
        return explicit
    python = QUIX_VENV / "bin" / "python"
    want = pinned()
    if python.exists():
        have = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
        versions = {p["name"].lower(): p["version"] for p in orjson.loads(have.stdout or "[]")}
        if all(versions.get(name) == v for name, v in want.items()):
            return str(python)
    else:
        print(f"making Quix's virtualenv {QUIX_VENV.relative_to(ROOT)} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True)
    return str(python)


def spec_of(s: Settings, runner: str, n: int) -> Spec:
    """What a runner is told: topics of the round, N, and the thresholds and VIPs in force (from Redis)."""
    t = topics_of(s)
    store = ThresholdStore(make_redis(s), s.redis.prefix)
    th = store.get()
    return Spec(runner=runner, bootstrap=s.kafka.servers, group=s.group(f"peer-{runner}"), source=t.requests,
                tiers={tier.value: t.tier(tier) for tier in Tier}, dlq=t.dlq, messages=n,
                threshold_version=th.version, length_threshold=th.length_threshold,
                escalate_below=th.escalate_below, abstain_above=th.abstain_above, handover_above=th.handover_above,
                max_message_bytes=s.max_message_bytes, vips=tuple(sorted(store.vips())))


def start(runner: str, spec: Spec, s: Settings, quix: str, log: IO[str]) -> subprocess.Popen[str]:
    """The runner's process; stderr to `log` (a file: a chatty library cannot block on a full pipe)."""
    python = quix if runner == "quix" else sys.executable
    env = s.with_env()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([python, "-m", MODULES[runner], spec.dumps()], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=log)


def finish(proc: subprocess.Popen[str], log: IO[str], runner: str, timeout: float,
           grace: float = 15.0) -> dict[str, Any]:
    """The runner's RESULT line, within `timeout` seconds; after it, `grace` seconds to stop by itself, then killed."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    result: dict[str, Any] | None = None
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "RESULT " in line:  # after any terminal codes a library wrote first
                result = orjson.loads(line.split("RESULT ", 1)[1])
                break
        try:
            proc.wait(grace if result is not None else 5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        watchdog.cancel()
    if result is None:
        log.seek(0)
        errors = log.read()[-4000:]
        raise SystemExit(f"{runner} gave no result (exit {proc.returncode}); its output:\n{''.join(seen)[-2000:]}"
                         f"\n{errors}")
    return result


def read_back(s: Settings, timeout: float = 60.0) -> dict[str, list[tuple[bytes | None, bytes | None]]]:
    """Every record of the run's tier topics and DLQ: topic name ("light", ..., "dlq") -> [(key, value)]."""
    t = topics_of(s)
    names = {tier.value: t.tier(tier) for tier in Tier} | {"dlq": t.dlq}
    out: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
    for name, topic in names.items():
        tail = Tail(s, topic, start="beginning")
        got: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout
        try:
            while not tail.caught_up and time.monotonic() < deadline:
                got.extend((m.key(), m.value()) for m in tail.poll(0.2, 10_000))
        finally:
            tail.close()
        out[name] = got
    return out


def produced(s: Settings) -> Counter[str]:
    """Records written to each tier topic and the DLQ of `s` (fresh topics: their end offsets), whatever retention
    has dropped since."""
    t = topics_of(s)
    names = {tier.value: t.tier(tier) for tier in Tier} | {"dlq": t.dlq}
    out: Counter[str] = Counter()
    for name, topic in names.items():
        tail = Tail(s, topic, start="end")  # true end offsets on either embedded broker
        out[name] = sum(tail.ends.values())
        tail.close()
    return out


def run_once(base: Settings, runner: str, msgs: list[bytes], quix: str,
             check: Callable[[dict[str, list[tuple[bytes | None, bytes | None]]]], None] | None = None,
             prepare: Callable[[Settings], None] | None = None) -> tuple[dict[str, Any], Counter[str]]:
    """One runner on fresh topics holding `msgs`: its result line and how many records each output topic got.

    `prepare`, when given, is called with the run's settings before the runner starts (to set VIPs, thresholds);
    `check` with every record of the output topics (read back: a small run, under the embedded broker's retention).
    """
    s = fresh_topics(base, backlog=True)
    if prepare is not None:
        prepare(s)
    try:
        fill(s, topics_of(s).requests, msgs)
        with tempfile.TemporaryFile("w+") as log:
            proc = start(runner, spec_of(s, runner, len(msgs)), s, quix, log)
            result = finish(proc, log, runner, timeout=120 + len(msgs) / 500)
        if check is not None:
            check(read_back(s))
        return result, produced(s)
    finally:
        # Deleted: the embedded noida re-serialises everything it keeps on every write (tests/conftest.py).
        with contextlib.suppress(Exception):
            delete_topics(s, topics_of(s).all(), timeout=10)


def body_of(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]], split: Counter[str]) -> str:
    """The BENCHMARKS.md section: what ran, the table, the rounds and the versions."""
    med = {r: statistics.median(x["rate"] for x in results[r]) for r in RUNNERS}
    rows = "\n".join(
        f"| {LABELS[r]} | {med[r]:,.0f} | " + ("—" if r == "tierflow" else f"{med['tierflow'] / med[r]:.1f}×") + " |"
        for r in RUNNERS)
    spread = "; ".join(f"{r} " + ", ".join(f"{x['rate']:,.0f}" for x in results[r]) for r in RUNNERS)
    stop = statistics.median(x.get("stop_s", 0.0) for x in results["quix"])
    total = sum(split.values())
    shares = ", ".join(f"{name} {n / total:.1%}" for name, n in sorted(split.items()) if n)
    libs = {r: results[r][-1].get("library", "?") for r in RUNNERS}
    return (
        f"{args.messages:,} requests (bench/ingest.py's: English and Chinese, 30-120 bytes of text) on the embedded "
        f"broker; one process per runner per round; median of {args.rounds} rounds in alternating order (ABC, CBA, "
        "...); fresh topics for every run. The three do the same per-message work by calling tierflow's functions "
        "(bench/peers/work.py: orjson parse and the request schema checks, features with CJK-aware lengths and "
        "cues, the routing rules, the routed envelope around the request's own bytes) and produce each request to "
        "its tier topic; the streaming runtime around that work is what differs:\n\n"
        "- tierflow: `pipeline.agents.ingest.Ingest`, one confluent-kafka loop: consume a batch, route, produce, "
        "flush, commit (its conversation step off: the peers route each message alone);\n"
        "- Quix Streams: an `Application` with its defaults (`auto_offset_reset=\"earliest\"`), "
        "`sdf.apply(route, metadata=True)`, `sdf.to_topic(select_topic, key=...)` (dynamic topic selection), "
        "`app.run(count=N)`;\n"
        "- faust-streaming: an `@app.agent` over the requests topic, `async for event in stream.events()`, "
        "`await topic.send(key=..., value=...)`, then `await app.producer.flush()`.\n\n"
        "Timed from the first output (the first batch for tierflow) to the last output flushed; Quix's time includes "
        f"its stop after `count` (the last checkpoint and closing the consumer: {stop:.2f} s, median). After each run "
        f"the end offsets of the tier topics were counted: every request routed once, split {shares}, the same for "
        "all three.\n\n"
        "| runner | msg/s | tierflow / runner |\n|---|---:|---:|\n"
        f"{rows}\n\n"
        f"Rounds (msg/s): {spread}.  \n"
        f"Versions: tierflow on {libs['tierflow']}; quixstreams {libs['quix']}, in its own virtualenv "
        f"(bench/peers/requirements-quix.txt); faust-streaming {libs['faust']}.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, in alternating order (median reported)")
    ap.add_argument("--quick", action="store_true", help="20,000 requests, one round")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    ap.add_argument("--only", help=f"comma list of runners ({', '.join(RUNNERS)}); --write needs all three")
    ap.add_argument("--quix-python", default=os.environ.get("TIERFLOW_QUIX_PYTHON"),
                    help="interpreter with quixstreams installed (default: .tierflow/peers/quix-venv, made on "
                         "first use) [env: TIERFLOW_QUIX_PYTHON]")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.rounds = 20_000, 1
    runners = tuple(r for r in RUNNERS if not args.only or r in args.only.split(","))
    if args.write and runners != RUNNERS:
        ap.error("--write needs all three runners")
    quix = quix_python(args.quix_python) if "quix" in runners else ""
    msgs = requests(args.messages)
    results: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
    splits: dict[str, Counter[str]] = {}
    with embedded_services() as base:
        for rnd in range(args.rounds):
            order = runners if rnd % 2 == 0 else runners[::-1]
            for runner in order:
                result, split = run_once(base, runner, msgs, quix)
                if sum(split.values()) != len(msgs):
                    raise SystemExit(f"{runner}: {sum(split.values())} records on the output topics for "
                                     f"{len(msgs)} requests ({dict(split)})")
                if splits and split != next(iter(splits.values())):
                    raise SystemExit(f"{runner} split the requests {dict(split)}; the others {splits}")
                splits[runner] = split
                results[runner].append(result)
                stop = f", of which {result['stop_s']:.2f} s stopping" if "stop_s" in result else ""
                print(f"round {rnd + 1} {runner}: {result['rate']:,.0f} msg/s "
                      f"({result['timed']:,} timed in {result['seconds']:.2f} s{stop}; {dict(split)})", flush=True)
    if runners != RUNNERS:
        for r in runners:
            print(f"{r}: median {statistics.median(x['rate'] for x in results[r]):,.0f} msg/s")
        return
    body = body_of(args, results, next(iter(splits.values())))
    print(body)
    if args.write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()

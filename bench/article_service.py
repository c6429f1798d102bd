"""The design article's service, written anew, against tierflow on the same models, messages and cores.

The article's FastAPI example routes each request by length (<= 50 characters: the light model, else the large
one) and calls the model for that one request. Here the same packaged models serve behind a single-threaded HTTP
server in a process of its own (one request at a time, as its synchronous endpoint does), twice: on the runtime
the article's code would use (torch, and e5 on its wheel's C engine) and on tierflow's own (the heavy encoder and e5
on ONNX Runtime on a CPU), so the gain
from the architecture shows apart from the gain from the runtime. tierflow runs as `tierflow up` does (embedded
broker and Redis, ingest, the three tiers, feedback; the core budget split among them).

Traffic: the shop pack's bilingual check set and as many messages of its held-out test set, shuffled (fixed seed)
and sent in that order, repeated as needed. Reported per system: flat-out throughput; at a steady offered load,
p50/p95/p99 latency, the CPU time per answered message (tierflow: every process of the stack, broker, Redis and idle
loops included; the article service: its process) and the accuracy of the answers' intents against the labels.

    python -m bench.article_service [--quick] [--write]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import orjson
import psutil
from confluent_kafka import Message

from bench.common import (
    AnswerReader,
    Run,
    missing_note,
    run_dir,
    run_ids,
    summarize,
    tail_percentiles,
    write_section,
)
from bench.domain_quality import Case, read_sets
from bench.pipeline import send
from pipeline.adapters.kafka import topics_of
from pipeline.contracts.topics import Tier
from pipeline.core import features
from pipeline.ops.devstack import Stack, free_port, running_stack, wait_agents_ready
from pipeline.settings import Settings
from workers.model import InferenceModel, Item

RUNTIMES = {"torch": "the article's (torch; e5 on its C engine)",
            "tierflow": "tierflow's (MiniLM and e5 on ONNX Runtime)"}


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


def article_settings(runtime: str) -> Settings:
    """The packaged models as they ship: no learned versions from Redis (the article has no learning loop), and no
    writer: its heavy answers are the policy text, as tierflow's are in this benchmark (the writer's cost is
    bench.generation's; with the GGUF on the machine the default would write every long message's answer)."""
    s = Settings().updated(learn_hot_swap=False, heavy_generator="none")
    # the article's runtime: torch, and e5 on the engine its package ships; tierflow's: both on ONNX Runtime
    return s.updated(heavy_runtime="torch", zh_runtime="engine") if runtime == "torch" else s


def serve(service: ArticleService, port: int = 0) -> tuple[HTTPServer, int]:
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

    server = HTTPServer(("127.0.0.1", port), Handler)  # one request at a time, as the article's sync endpoint
    return server, int(server.server_address[1])


def serve_main(runtime: str) -> None:
    """`--serve RUNTIME`: load the models, print the port, answer until stdin closes."""
    from workers.models.registry import tier_model

    s = article_settings(runtime)
    light, heavy = tier_model(s, Tier.LIGHT), tier_model(s, Tier.HEAVY)
    light.setup("cpu")
    heavy.setup("cpu")
    server, port = serve(ArticleService(light, heavy))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"PORT {port}", flush=True)
    sys.stdin.read()
    server.shutdown()


# --------------------------------------------------------------------------- traffic
def shop_messages(seed: int = 0) -> list[Case]:
    """The shop pack's check set (English and Chinese) and as many held-out test messages, shuffled."""
    from workers.domains import load_domain

    sets = read_sets(load_domain("ecommerce"))
    check = [c for name, cases in sets.items() if name.startswith("check set") for c in cases]
    held = [c for name, cases in sets.items() if not name.startswith("check set") for c in cases]
    rng = random.Random(seed)
    out = check + rng.sample(held, min(len(held), len(check)))
    rng.shuffle(out)
    return out


def long_share(texts: Sequence[str], threshold: int = 50) -> tuple[int, float]:
    """How many of `texts` are longer than `threshold` characters (the article's rule sends them to
    the large model), and their share of the traffic when the texts are sent in turn."""
    long = sum(len(t) > threshold for t in texts)
    return long, long / len(texts)


def correct(case: Case, intent: object) -> bool:
    return intent == case.intent or intent in case.also


@dataclass
class Measured:
    """One system under one load: what was sent and answered, latencies, accuracy, CPU per answer."""

    rate: float  # answered msg/s
    sent: int
    latencies_ms: list[float]  # one per answered message
    accuracy: float  # correct intents / sent
    cpu_ms: float  # CPU time per answered message
    by_process: dict[str, float] = field(default_factory=dict)  # CPU ms per answered message, per process
    broker_threads: dict[str, float] = field(default_factory=dict)  # the broker's, per thread name (Linux)

    @property
    def missing(self) -> int:
        return self.sent - len(self.latencies_ms)

    def cells(self) -> list[str]:
        floor = max(self.latencies_ms, default=0.0)
        return [f"> {floor:.0f}" if v is None else f"{v:.1f}"
                for v in tail_percentiles(self.latencies_ms, self.missing)]


def thread_cpu_s(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a process's threads by thread name, from /proc (empty where there is none)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_s(procs: Sequence[psutil.Process]) -> float:
    """User + system CPU seconds of `procs` and their live children (gone ones count as 0)."""
    total = 0.0
    seen: set[int] = set()
    for p in procs:
        try:
            for q in [p, *p.children(recursive=True)]:
                if q.pid not in seen:
                    seen.add(q.pid)
                    t = q.cpu_times()
                    total += t.user + t.system
        except psutil.Error:
            pass
    return total


# --------------------------------------------------------------------------- the article service
def call(port: int, text: str) -> tuple[float, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/infer", json.dumps({"text": text}), {"Content-Type": "application/json"})
    intent = json.loads(conn.getresponse().read())["intent"]
    conn.close()
    return (time.perf_counter() - t0) * 1000, intent


def article_run(port: int, pid: int, cases: Sequence[Case], n: int, rate: float | None) -> Measured:
    """n requests (cases in turn): flat out from 8 clients, or open loop at `rate` msg/s (latency includes the
    wait for the one-at-a-time server)."""
    proc = psutil.Process(pid)
    cpu0, t0 = cpu_s([proc]), time.perf_counter()
    with ThreadPoolExecutor(8 if rate is None else 256) as pool:
        futs = []
        for i in range(n):
            if rate:
                ahead = i / rate - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(ahead)
            futs.append(pool.submit(call, port, cases[i % len(cases)].text))
        out = [f.result() for f in futs]
    wall, cpu = time.perf_counter() - t0, cpu_s([proc]) - cpu0
    ok = sum(correct(cases[i % len(cases)], intent) for i, (_, intent) in enumerate(out))
    return Measured(n / wall, n, [ms for ms, _ in out], ok / n, cpu * 1000 / n)


def with_article(runtime: str, run: Callable[[int, int], tuple[Measured, Measured]]) -> tuple[Measured, Measured]:
    """Start the article service on `runtime` in a process of its own, run `run(port, pid)`, stop it."""
    p = subprocess.Popen([sys.executable, "-m", "bench.article_service", "--serve", runtime], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"the article service ({runtime}) did not start: {line!r}")
        return run(int(line.split()[1]), p.pid)
    finally:
        if p.stdin is not None:
            p.stdin.close()
        p.wait(30)


# --------------------------------------------------------------------------- tierflow
class IntentReader(AnswerReader):
    """An answer reader that also keeps each expected answer's intent, tier and timings."""

    def __init__(self, s: Settings, topic: str, expected: Sequence[str]) -> None:
        super().__init__(s, topic, expected)
        self.answers: dict[str, dict[str, object]] = {}

    def take(self, m: Message, now: float) -> None:
        super().take(m, now)
        key = m.key()
        if m.error() is None and m.value() and isinstance(key, bytes) and key.decode() in self.log.expected:
            self.answers.setdefault(key.decode(), orjson.loads(m.value() or b"{}"))


def tierflow_run(stack: Stack, cases: Sequence[Case], n: int, rate: float | None, timeout: float
                 ) -> tuple[Measured, dict[str, dict[str, object]]]:
    s = stack.settings
    t = topics_of(s)
    ids = run_ids(n)
    texts = [cases[i % len(cases)].text for i in range(n)]
    reader = IntentReader(s, t.answers, ids)
    reader.start()
    procs = {p.name: psutil.Process(p.popen.pid) for p in stack.procs}
    each0 = {name: cpu_s([proc]) for name, proc in procs.items()}
    broker = procs["broker"].pid if "broker" in procs else None
    threads0 = thread_cpu_s(broker) if broker else {}
    t0 = time.time()
    sent_at = send(s, t.requests, ids, rate, texts=texts)
    gave_up_at = reader.wait(timeout)
    each = {name: cpu_s([proc]) - each0[name] for name, proc in procs.items()}
    threads = {name: t - threads0.get(name, 0.0) for name, t in (thread_cpu_s(broker) if broker else {}).items()}
    cpu = sum(each.values())
    reader.stop()
    run = summarize(sent_at, reader.log, t0, gave_up_at)
    by_id = {rid: cases[i % len(cases)] for i, rid in enumerate(ids)}
    ok = sum(correct(by_id[rid], a.get("intent")) for rid, a in reader.answers.items())
    per = 1000 / max(1, run.answered)
    return (Measured(run.rate, n, run.latencies_ms, ok / n, cpu * per, {k: v * per for k, v in each.items()},
                     {k: v * per for k, v in threads.items() if v > 0}), reader.answers)


def hops(answers: dict[str, dict[str, object]]) -> str:
    """Medians of the answers' own timings per tier: where tierflow's time goes."""
    by_tier: dict[str, list[dict[str, float]]] = {}
    for a in answers.values():
        by_tier.setdefault(str(a.get("tier")), []).append(a.get("timings_ms") or {})  # type: ignore[arg-type]
    rows = []
    for tier, ts in sorted(by_tier.items()):
        med = {k: statistics.median(x.get(k, 0.0) for x in ts) for k in ("ingest", "queue", "inference", "total")}
        rows.append(f"| {tier} | {len(ts)} | {med['ingest']:.1f} | {med['queue']:.1f} | {med['inference']:.1f} | "
                    f"{med['total']:.1f} |")
    return ("| tier | answers | ingest | tier topic (queue) | inference | total (received to produced) |\n"
            "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows))


# --------------------------------------------------------------------------- report
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--rate", type=float, default=50.0, help="steady offered load (msg/s)")
    ap.add_argument("--messages", type=int, default=None, help="flat-out requests to the article service "
                                                                 "(2,000; quick 300); tierflow gets 5x as many")
    ap.add_argument("--seconds", type=float, default=None, help="length of the steady-load runs (20 s; quick 5 s)")
    ap.add_argument("--serve", choices=sorted(RUNTIMES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_main(args.serve)
        return
    n = args.messages or (300 if args.quick else 2000)
    seconds = args.seconds or (5 if args.quick else 20)
    steady = max(1, int(args.rate * seconds))
    cases = shop_messages()

    article: dict[str, tuple[Measured, Measured]] = {}
    for runtime in RUNTIMES:
        article[runtime] = with_article(runtime, lambda port, pid: (
            article_run(port, pid, cases, n, None), article_run(port, pid, cases, steady, args.rate)))

    # The writer off: the article's service answers with the policy text, and so must tierflow here, for the same
    # models to be compared (the writer's cost is bench.generation's).
    with run_dir("article") as data, running_stack(Settings(kafka_port=free_port(), redis_port=free_port(),
                                                            data_dir=data, heavy_generator="none")) as stack:
        if wait_agents_ready(stack) is None:
            raise SystemExit(f"tierflow up did not become ready; logs in {stack.log_dir}")
        time.sleep(2)
        tf_flat, _ = tierflow_run(stack, cases, n * 5, None, 600)
        time.sleep(2)
        tf_steady, answers = tierflow_run(stack, cases, steady, args.rate, 300)
    print(body := report(cases, article, tf_flat, tf_steady, answers, args.rate))
    if args.write:
        write_section("Against the design article's service", body)


def report(cases: Sequence[Case], article: dict[str, tuple[Measured, Measured]], tf_flat: Measured,
           tf_steady: Measured, answers: dict[str, dict[str, object]], rate: float) -> str:
    long, share = long_share([c.text for c in cases], ArticleService.LENGTH_THRESHOLD)
    zh = sum(c.lang == "zh" for c in cases)
    rows = [f"| article service, {RUNTIMES[rt]} | {flat.rate:,.1f} | " + " | ".join(st.cells())
            + f" | {st.cpu_ms:.1f} | {st.accuracy:.1%} |" for rt, (flat, st) in article.items()]
    rows.append(f"| tierflow (`tierflow up`: micro-batched tiers on Kafka) | {tf_flat.rate:,.1f} | "
                + " | ".join(tf_steady.cells()) + f" | {tf_steady.cpu_ms:.1f} | {tf_steady.accuracy:.1%} |")
    torch_flat, torch_steady = article["torch"]
    own_flat, own_steady = article["tierflow"]
    missing = missing_note({name: Run(m.sent, len(m.latencies_ms), 0.0, m.latencies_ms)
                            for name, m in (("tierflow flat out", tf_flat), ("tierflow steady", tf_steady))})
    return (
        f"Same packaged models (the default e-commerce pack), same messages: its check set and as many held-out "
        f"test messages, {len(cases)} in all ({zh} Chinese; {long}, {share:.0%}, over "
        f"{ArticleService.LENGTH_THRESHOLD} characters, which the article's rule sends to the large model), "
        "shuffled and sent in that order; same 2 cores. The article service answers one request at a time in a "
        "process of its own; tierflow is a whole `tierflow up`. Latency: request sent to answer read. CPU per "
        f"answer at {rate:.0f} msg/s: tierflow's every process (broker, Redis, agents), the article service's own "
        "process. Accuracy: the answer's intent against the message's label.\n\n"
        f"| system | throughput flat out (msg/s) | p50 ms at {rate:.0f} msg/s | p95 ms | p99 ms | CPU ms per answer | "
        "accuracy |\n|---|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
        + (f"{missing}\n\n" if missing else "")
        + f"Throughput ratio tierflow / article service: {tf_flat.rate / torch_flat.rate:.1f}x on the article's "
        f"runtime, {tf_flat.rate / own_flat.rate:.1f}x on tierflow's. CPU per answer, article service / tierflow: "
        f"{torch_steady.cpu_ms / max(tf_steady.cpu_ms, 1e-9):.1f}x and "
        f"{own_steady.cpu_ms / max(tf_steady.cpu_ms, 1e-9):.1f}x. 1-minute load average at the end: "
        f"{os.getloadavg()[0]:.1f}.\n\n"
        f"Where tierflow's time goes at {rate:.0f} msg/s (medians of the answers' own timings, ms):\n\n"
        + hops(answers) + "\n\n"
        + f"tierflow's CPU per answer at {rate:.0f} msg/s by process (ms): "
        + ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(tf_steady.by_process.items(), key=lambda kv: -kv[1]))
        + "." + (" The broker's by thread: " + ", ".join(
            f"{name} {ms:.1f}" for name, ms in sorted(tf_steady.broker_threads.items(), key=lambda kv: -kv[1]))
            + "." if tf_steady.broker_threads else "")
        + "\n\n" + targets(article, tf_flat, tf_steady)
    )


def targets(article: dict[str, tuple[Measured, Measured]], tf_flat: Measured, tf_steady: Measured) -> str:
    """Issue 33's targets against this run, each met or not, and what keeps tierflow from them."""
    (torch_flat, torch_steady), (own_flat, own_steady) = article["torch"], article["tierflow"]
    p50, _, p99 = tail_percentiles(tf_steady.latencies_ms, tf_steady.missing)
    checks = [
        ("throughput >= 5x the article service's", tf_flat.rate >= 5 * torch_flat.rate),
        ("throughput >= 2x the article service on tierflow's runtime", tf_flat.rate >= 2 * own_flat.rate),
        ("CPU per answer <= 1/5 of the article service's", tf_steady.cpu_ms * 5 <= torch_steady.cpu_ms),
        ("p50 <= 10 ms and p99 <= 50 ms at the steady load", p50 is not None and p99 is not None
         and p50 <= 10 and p99 <= 50),
        ("accuracy >= the article service's", tf_steady.accuracy >= max(torch_steady.accuracy,
                                                                         own_steady.accuracy)),
    ]
    met = "; ".join(f"{name}: {'met' if ok else '**not met**'}" for name, ok in checks)
    return (f"Targets: {met}.\n\n" + (
        "" if all(ok for _, ok in checks) else
        "What keeps tierflow from them. Throughput flat out is the heavy worker's: one process on one thread of "
        "the core budget encodes every heavy message (a quarter of them) while the light tier idles on the other "
        "core; the article service's flat-out figure is one model call per message on the whole machine. CPU per "
        "answer: every message crosses four topics and three processes, each hop a produce, a fetch and a commit on "
        "a broker that answers every fetch at once (consumers pace themselves, pipeline/core/fetch_pacing.py: they "
        "rest after sparse records and while away with a batch, and the tier workers wait for their doorbell); the "
        "embedded noida re-serialises everything its topics keep every few seconds while anything changes (its "
        "`autosave` thread above: a cost per second while traffic flows, spread over however many answers that "
        "second brings); and idle, the whole stack's few percent of a core is part of every answer. The models are "
        "the smaller part (the line above). What would close it: ingest "
        "and the tiers in one process on a small machine (one consumer and one producer instead of four of each), "
        "heavy workers as many as the cores free of other work, and a broker that holds fetches (Apache Kafka "
        "honours fetch.wait.max.ms).\n"))


if __name__ == "__main__":
    main()

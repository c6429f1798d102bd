"""The bodies of the `tierflow` commands, one `cmd_<name>(args) -> exit code` each; `pipeline/cli.py` parses
the command line and dispatches here.

Heavy modules (torch, the agents, the models, faust, confluent_kafka) are imported inside the command that needs
them, so `tierflow send` loads none it does not use (tests/architecture/test_thin_cli.py checks the import).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import mimetypes
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.errors import ConfigError, InvalidThresholds, ServiceUnavailable

if TYPE_CHECKING:  # the commands import what they use: `tierflow --help` stays fast
    from pipeline.contracts.records import Answer, Handover
    from pipeline.settings import Settings


# --------------------------------------------------------------------------- helpers
def settings_of(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with CLI overrides applied."""
    from pipeline.settings import get_settings

    s = get_settings()
    updates: dict[str, Any] = {}
    for field in ("kafka_port", "redis_port", "metrics_port"):
        value = getattr(args, field, None)
        if value is not None:
            updates[field] = value
    return s.updated(**updates) if updates else s


def setup_logging(settings: Settings) -> None:
    """The root logger at `log_level`, as JSON lines or as text, scrubbed of secrets either way; faust quieter."""
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    if settings.log_json:
        from pipeline.logs import JsonFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler], force=True)
    else:
        from pipeline.logs import ScrubbingFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(ScrubbingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("faust").setLevel(max(level, logging.WARNING))


def fatal(command: str, lines: list[str], json_logs: bool) -> None:
    """A fatal error, one line each: JSON log records when logs are JSON (a log pipeline parses every line of
    the process), else `tierflow CMD: ...` on stderr."""
    if json_logs:
        for line in lines:
            logging.getLogger("tierflow").error("tierflow %s: %s", command, line)
        return
    for line in lines:
        print(f"tierflow {command}: {line}", file=sys.stderr)


def _redis(settings: Settings) -> Any:
    from pipeline.adapters.kafka import check_reachable
    from pipeline.adapters.redis_client import make_redis

    check_reachable(settings.redis.address, "Redis")
    return make_redis(settings, command=True)


_interrupted = threading.Event()


def interrupted() -> bool:
    """Whether a SIGINT (Ctrl-C) stopped the command: it then exits 130, as a shell expects."""
    return _interrupted.is_set()


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGTERM and SIGINT (instead of KeyboardInterrupt): the command winds down by itself."""
    def handler(signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            _interrupted.set()
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


# --------------------------------------------------------------------------- commands
def cmd_topics(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka import create_topics, specs_of

    s = settings_of(args)
    if args.action == "create":
        created = create_topics(s)
        for spec in specs_of(s):
            mark = "created" if spec.name in created else "exists"
            print(f"{spec.name:<32} partitions={spec.partitions} rf={spec.replication_factor}  {mark}")
    else:
        for spec in specs_of(s):
            print(f"{spec.name:<32} partitions={spec.partitions} rf={spec.replication_factor} {spec.config}")
    return 0


class Agent(Protocol):
    def run(self) -> None: ...

    def stop(self) -> None: ...


def run_agent(s: Settings, make: Callable[[Settings], Agent]) -> int:
    """A long-running agent: the broker dialled first (a clear error), /metrics served, SIGTERM/SIGINT stop it."""
    from pipeline import metrics
    from pipeline.adapters.kafka import check_reachable

    check_reachable(s.kafka.servers, "Kafka")
    metrics.serve(s.metrics_port)
    agent = make(s)
    stop_on_signals(agent.stop)
    agent.run()
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from pipeline.agents.ingest import Ingest

    return run_agent(settings_of(args), Ingest)


def cmd_worker(args: argparse.Namespace) -> int:
    from pipeline.contracts.topics import Tier

    s = settings_of(args)
    tier = Tier(args.tier)
    if args.concurrency > 1:
        return _worker_pool(args, s, tier)
    return _run_worker(s, tier, args.device)


def _run_worker(s: Settings, tier: Any, device: str | None) -> int:
    from pipeline import metrics
    from pipeline.adapters.kafka import check_reachable
    from workers.runner import Worker, announce, worker_id_of

    metrics.serve(s.metrics_port)  # alive (and /ready saying "starting") while torch imports
    worker_id = worker_id_of(tier)
    beat = announce(s, tier, worker_id)  # before the imports and weights that take seconds
    try:
        from workers import threads

        threads.apply(s.threads or s.cpus or threads.available_cpus())  # before any runtime loads
        from workers.devices import tier_device
        from workers.models.registry import tier_model

        model = tier_model(s, tier)  # a wrong model name is said before the broker is dialled
        check_reachable(s.kafka.servers, "Kafka")
        worker = Worker(s, tier, model, tier_device(s, tier, device), worker_id=worker_id, announced=beat)
    except BaseException:
        beat.stop()
        raise
    stop_on_signals(worker.stop)
    worker.run()
    return 0


def _worker_pool(args: argparse.Namespace, s: Settings, tier: Any) -> int:
    """N worker processes of one tier sharing its consumer group; exits when all have stopped."""
    import subprocess

    from pipeline.ops.devstack import _die_with_parent

    argv = [sys.executable, "-m", "pipeline.cli", "worker", "--tier", tier.value]
    if args.device:
        argv += ["--device", args.device]
    procs = []
    for i in range(args.concurrency):
        env = dict(os.environ)
        if s.metrics_port is not None:
            env["TIERFLOW_METRICS_PORT"] = str(s.metrics_port + i)
        env["TIERFLOW_WORKER_ID"] = f"{s.worker_id or socket.gethostname()}-{i}"  # a stable transactional id each
        procs.append(subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent))

    def stop() -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()

    stop_on_signals(stop)
    codes = [p.wait() for p in procs]
    return max(codes, default=0)


def cmd_feedback(args: argparse.Namespace) -> int:
    from pipeline.agents.feedback import main as feedback_main

    return feedback_main(settings_of(args))


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.ops.demo import run_demo

    return run_demo(settings_of(args), timeout_s=args.timeout)


def cmd_send(args: argparse.Namespace) -> int:
    import orjson  # what contracts.models.dumps writes a plain dict with, without loading the models

    from pipeline.adapters.doorbell import ring_once
    from pipeline.adapters.kafka import DeliveryTracker, check_reachable, make_producer, topics_of

    s = settings_of(args)
    check_reachable(s.kafka.servers, "Kafka")
    req: dict[str, Any] = {"id": args.id or uuid.uuid4().hex, "ts": int(time.time() * 1000)}
    if args.text:
        req["text"] = args.text
    if args.user:
        req["user_id"] = args.user
    if args.lang:
        req["lang"] = args.lang
    if args.label:
        req["label"] = args.label
    if args.conversation:
        req["conversation_id"] = args.conversation
    if args.image:
        path = Path(args.image)
        if not path.is_file():
            raise ConfigError(f"--image {args.image}: no such file (expected a PNG, JPEG or WebP image)")
        mime = mimetypes.guess_type(path.name)[0] or "image/png"
        req["image"] = {"data": base64.b64encode(path.read_bytes()).decode(), "mime": mime}
    if "text" not in req and "image" not in req:
        raise ConfigError("give a TEXT or --image")
    reader = None
    if args.wait:
        from pipeline.adapters.tails import AnswerReader

        # Positions first, then the request: an answer however fast cannot slip past the reader.
        reader = AnswerReader(s, from_beginning=False)
    try:
        delivery = DeliveryTracker()
        ack_conf: dict[str, Any] = {"message.timeout.ms": int(args.ack_timeout * 1000)}
        producer = make_producer(s, **ack_conf)
        producer.produce(topics_of(s).requests, orjson.dumps(req), key=req.get("user_id") or req["id"],
                         on_delivery=delivery)
        left = producer.flush(args.ack_timeout + 1)
        if left or delivery.failed:
            why = "; ".join(delivery.errors) or f"no acknowledgement within {args.ack_timeout:.0f}s"
            raise ServiceUnavailable(f"{req['id']} was not acknowledged by the broker at {s.kafka.servers}: {why}")
        ring_once(s, [topics_of(s).requests])  # wakes a resting ingest
        print(f"sent {req['id']}", flush=True)
        if reader is None:
            return 0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            for ans in reader.poll(0.2):
                if ans.get("request_id") == req["id"]:
                    print(json.dumps(ans, ensure_ascii=False, indent=2))
                    return 0
    finally:
        if reader is not None:
            reader.close()
    print(f"tierflow send: no answer for {req['id']} within {args.timeout:.0f}s (is `tierflow up` running? "
          "`tierflow status` shows the workers)", file=sys.stderr)
    return 1


def cmd_answers(args: argparse.Namespace) -> int:
    from pipeline.adapters.tails import AnswerReader

    return _print_records(args, AnswerReader, _answer_line)


def cmd_handovers(args: argparse.Namespace) -> int:
    """What a human agents' desk reads: the requests handed over to a person, each once."""
    from pipeline.adapters.tails import HandoverReader

    return _print_records(args, HandoverReader, _handover_line)


def _print_records(args: argparse.Namespace, reader_of: Any, line: Any) -> int:
    from pipeline.adapters.kafka import check_reachable

    s = settings_of(args)
    check_reachable(s.kafka.servers, "Kafka")
    reader = reader_of(s, from_beginning=not args.new, listen=args.follow)
    stopping = threading.Event()
    stop_on_signals(stopping.set)
    idle_since = time.monotonic()
    try:
        while not stopping.is_set():
            batch = reader.poll(0.2)
            if batch:
                idle_since = time.monotonic()
            for ans in batch:
                if args.json:
                    print(json.dumps(ans, ensure_ascii=False), flush=True)
                else:
                    print(line(ans), flush=True)
            # Without --follow: what existed when the command started, then (--idle) a little more.
            if not args.follow and reader.caught_up and time.monotonic() - idle_since >= args.idle:
                break
    finally:
        reader.close()
    return 0


def _answer_line(ans: Answer) -> str:
    timings = ans.get("timings_ms")
    total = timings.get("total", "?") if timings else "?"
    tier = f"{ans.get('tier')}→person" if ans.get("handover") else ans.get("tier")
    return (f"{ans.get('request_id')!s:<20} {tier!s:<10} {ans.get('intent')!s:<28} "
            f"{total!s:>6}ms  {ans.get('answer')}")


def _handover_line(h: Handover) -> str:
    return (f"{h.get('request_id')!s:<20} {h.get('lang')!s:<3} {h.get('tier')!s:<10} "
            f"oos {h.get('oos_score', 0.0):.2f}>{h.get('handover_above', 1.0):.2f}  "
            f"nearest {h.get('intent')!s:<24} {h.get('text')}")


def cmd_thresholds(args: argparse.Namespace) -> int:
    from pipeline.adapters.threshold_store import ThresholdStore
    from pipeline.core.thresholds import parse_value

    s = settings_of(args)
    store = ThresholdStore.of(s, _redis(s))
    store.cache.ensure_restored()
    who = f"cli:{os.environ.get('USER', 'operator')}"
    if args.action == "show":
        doc = store.get()
        print(json.dumps(doc.model_dump(mode="json"), indent=2, ensure_ascii=False))
    elif args.action == "set":
        values = {args.key: parse_value(args.key, args.value)}
        doc = store.update(who, args.reason or f"set {args.key}={args.value}", **values)
        print(f"v{doc.version}: {args.key} = {getattr(doc, args.key)}")
    elif args.action == "pin":
        doc = store.get()
        pins = tuple(sorted(set(doc.pinned) | set(args.keys)))
        doc = store.update(who, f"pin {', '.join(args.keys)}", pinned=pins)
        print(f"v{doc.version}: pinned {', '.join(doc.pinned)}")
    elif args.action == "unpin":
        doc = store.get()
        pins = tuple(p for p in doc.pinned if p not in args.keys)
        doc = store.update(who, f"unpin {', '.join(args.keys)}", pinned=pins)
        print(f"v{doc.version}: pinned {', '.join(doc.pinned) or '(none)'}")
    elif args.action == "history":
        for doc in store.history(args.last):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc.updated_at)) if doc.updated_at else "-"
            print(f"v{doc.version:<4} {when}  {doc.updated_by:<18} len={doc.length_threshold:<5} "
                  f"esc={doc.escalate_below:<6.3f} abst={doc.abstain_above:<6.3f} hand={doc.handover_above:<6.3f} "
                  f"{doc.reason}")
    elif args.action == "rollback":
        doc = store.rollback(args.version, who)
        print(f"v{doc.version}: rolled back to the values of v{args.version}")
    return 0


def cmd_vip(args: argparse.Namespace) -> int:
    from pipeline.adapters.threshold_store import ThresholdStore

    s = settings_of(args)
    store = ThresholdStore.of(s, _redis(s))
    store.cache.ensure_restored()
    if args.action == "add":
        store.vip_add(*args.users)
    elif args.action == "remove":
        store.vip_remove(*args.users)
    for u in sorted(store.vips()):
        print(u)
    return 0


def _conversations(s: Settings) -> Any:
    from pipeline.adapters.conversations import Conversations
    from pipeline.contracts.keys import Keys

    return Conversations(_redis(s), Keys(s.redis.prefix), s.conversation, "cli")


def cmd_conversation(args: argparse.Namespace) -> int:
    s = settings_of(args)
    turns = _conversations(s).turns(args.user, args.replay_job)
    for t in turns:
        if args.json:
            print(json.dumps(t, ensure_ascii=False))
        else:
            when = time.strftime("%H:%M:%S", time.localtime(t["at"] / 1000))
            print(f"{when} {t['id']!s:<20} {t.get('intent', '(being answered)')!s:<26} {t['text']}")
            if t.get("answer"):
                print(f"{'':>30}-> {t.get('tier')}: {t['answer']}")
    if not turns and not args.json:
        print(f"no conversation kept for {args.user}", file=sys.stderr)
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    s = settings_of(args)
    store = _conversations(s)
    left = []
    for user in args.users:
        n = store.forget(user)
        held = store.held(user)
        left += held
        print(f"forgot {user}: {n} key{'s' if n != 1 else ''} deleted; "
              + (f"STILL HELD: {', '.join(held)}" if held else "nothing of theirs is left in the store"))
    return 1 if left else 0


def cmd_route(args: argparse.Namespace) -> int:
    """Explain a routing decision without touching Kafka (Redis only if reachable)."""
    from pipeline.adapters.threshold_store import ThresholdStore
    from pipeline.contracts.models import Request
    from pipeline.core import features
    from pipeline.core.routing import route
    from pipeline.core.thresholds import Thresholds

    s = settings_of(args)
    th, vip, source = Thresholds(), False, "defaults (Redis not reachable)"
    try:
        store = ThresholdStore(_redis(s), s.redis.prefix)  # reads only: an empty Redis is explained as such
        th, source = store.get_or_none() or Thresholds(), f"Redis {s.redis.address}"
        vip = args.user in store.vips() if args.user else False
    except (ServiceUnavailable, OSError, InvalidThresholds):
        pass
    if args.vip:
        vip = True
    image = {"data": "", "mime": "image/png"} if args.image else None
    req = Request(id="explain", text=args.text, user_id=args.user, lang=args.lang, image=image)
    feats = features.extract(req, vip=vip, image_bytes=1 if args.image else 0)
    r = route(feats, th.length_threshold)
    out = {"features": feats, "tier": r.tier.value, "route_reason": r.reason,
           "length_threshold": th.length_threshold, "escalate_below": th.escalate_below,
           "threshold_version": th.version, "thresholds_from": source}
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    """Chaos: make a tier's workers slower (injected latency per batch) for a while."""
    from pipeline.adapters.heartbeats import fault_key

    s = settings_of(args)
    r = _redis(s)
    key = fault_key(s.redis.prefix, args.tier)
    if args.ms <= 0:
        r.delete(key)
        print(f"{args.tier}: injected latency cleared")
    else:
        r.set(key, str(args.ms), ex=int(args.seconds) if args.seconds else None)
        print(f"{args.tier}: +{args.ms} ms per batch" + (f" for {args.seconds:.0f}s" if args.seconds else ""))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from workers.training.run import main as train_main

    argv: list[str] = []
    for flag in ("domain", "data", "test", "out", "models", "seed", "epochs"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag}", str(getattr(args, flag))]
    return train_main(argv)


def cmd_replay(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka import Tail, check_reachable, topics_of
    from pipeline.agents.replay import (
        FileSource,
        Replayer,
        Source,
        TopicSource,
        job_name,
        parse_offsets,
        parse_when,
    )
    from pipeline.ops.replay_results import accuracy_table, wait_for_results

    s = settings_of(args)
    check_reachable(s.kafka.servers, "Kafka")
    check_reachable(s.redis.address, "Redis")
    source: Source
    if args.file:
        source = FileSource(name=f"file:{Path(args.file).resolve()}", path=Path(args.file))
    elif args.topic:
        source = TopicSource(
            name=f"topic:{args.topic}", settings=s, topic=args.topic,
            start_ts=parse_when(args.start) if args.start else None,
            end_ts=parse_when(args.end) if args.end else None,
            start_offsets=parse_offsets(args.start_offsets) if args.start_offsets else {},
            end_offsets=parse_offsets(args.end_offsets) if args.end_offsets else {},
        )
    else:
        raise ConfigError("give --file PATH or --topic NAME")
    job = args.job or job_name(source, start=args.start, end=args.end, so=args.start_offsets,
                               eo=args.end_offsets, pin=args.pin_thresholds, shadow=args.shadow, limit=args.limit)
    # The results reader takes its positions before the first record is sent: no result can slip past it.
    results = Tail(s, topics_of(s).results, "end") if args.wait else None
    summary = Replayer(s).run(source, job=job, rate=args.rate, limit=args.limit, pin_thresholds=args.pin_thresholds,
                              shadow=args.shadow, force=args.force, restart=args.restart,
                              progress=sys.stderr.isatty(),
                              max_live_slowdown=None if args.max_live_slowdown <= 0 else args.max_live_slowdown)
    print(summary.line())
    if results is not None:
        if not summary.ids:
            results.close()
            return 0
        got = wait_for_results(results, set(summary.ids), args.wait, args.shadow)
        print(f"{len(got)} results for {len(summary.ids)} replayed requests")
        print(accuracy_table(got))
    return 0


# feedback last: its section compares the agent with the pipeline rates the others just recorded
BENCHES = ("ingest", "batching", "heavy_runtime", "quality", "pipeline", "article_service", "sustained", "durability",
           "peers", "feedback", "learning")


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks in bench/ (a source checkout) and write their sections of BENCHMARKS.md."""
    import subprocess

    root = Path(__file__).resolve().parents[2]  # the checkout: pipeline/ops/ is two below it
    if not (root / "bench" / "common.py").exists():
        raise ConfigError("tierflow bench runs from a source checkout (the bench/ folder is not installed)")
    chosen = args.only.split(",") if args.only else list(BENCHES)
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown:
        raise ConfigError(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    failed = []
    for name in chosen:
        if not (root / "bench" / f"{name}.py").exists() and not (root / "bench" / name / "__main__.py").exists():
            print(f"== {name}: not present in this checkout, skipped", flush=True)
            continue
        argv = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if args.quick else []),
                *([] if args.no_write else ["--write"])]
        print(f"== {name}: {' '.join(argv[1:])}", flush=True)
        if subprocess.run(argv, cwd=root).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from pipeline.ops.status import main as status_main

    return status_main(settings_of(args), once=args.once, interval_s=args.interval)


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.ops.report import main as report_main

    return report_main(settings_of(args), out_dir=args.out, minutes=args.minutes)

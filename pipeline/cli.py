"""The `tierflow` command. Every flag that has a setting falls back to its TIERFLOW_* variable."""

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.adapters.redis_client import make_redis
from pipeline.errors import ConfigError, InvalidThresholds, ServiceUnavailable, TierflowError
from pipeline.settings import DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT, Settings, get_settings

log = logging.getLogger("tierflow")


# --------------------------------------------------------------------------- helpers
def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with CLI overrides applied."""
    s = get_settings()
    updates: dict[str, Any] = {}
    for field in ("kafka_port", "redis_port", "metrics_port"):
        value = getattr(args, field, None)
        if value is not None:
            updates[field] = value
    return s.updated(**updates) if updates else s


def _setup_logging(settings: Settings) -> None:
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


def _redis(settings: Settings) -> Any:

    from pipeline.adapters.kafka import check_reachable

    check_reachable(settings.redis.address, "Redis")
    return make_redis(settings, command=True)


def _stop_on_signals(stop: Callable[[], None]) -> None:
    def handler(signum: int, frame: object) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _env_help(text: str, env: str) -> str:
    return f"{text} [env: {env}]"


# --------------------------------------------------------------------------- commands
def cmd_topics(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka import create_topics, specs_of

    s = _settings(args)
    if args.action == "create":
        created = create_topics(s)
        for spec in specs_of(s):
            mark = "created" if spec.name in created else "exists"
            print(f"{spec.name:<32} partitions={spec.partitions} rf={spec.replication_factor}  {mark}")
    else:
        for spec in specs_of(s):
            print(f"{spec.name:<32} partitions={spec.partitions} rf={spec.replication_factor} {spec.config}")
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from pipeline import metrics
    from pipeline.adapters.kafka import check_reachable
    from pipeline.agents.ingest import Ingest

    s = _settings(args)
    check_reachable(s.kafka.servers, "Kafka")
    metrics.serve(s.metrics_port)
    agent = Ingest(s)
    _stop_on_signals(agent.stop)
    agent.run()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from pipeline.contracts.topics import Tier

    s = _settings(args)
    tier = Tier(args.tier)
    if args.concurrency > 1:
        return _worker_pool(args, s, tier)
    return _run_worker(s, tier, args.device)


def _run_worker(s: Settings, tier: Any, device: str | None) -> int:
    from pipeline import metrics
    from pipeline.adapters.kafka import check_reachable
    from workers.devices import tier_device
    from workers.models.registry import tier_model
    from workers.runner import Worker

    model = tier_model(s, tier)  # a wrong model name is said before the broker is dialled
    check_reachable(s.kafka.servers, "Kafka")
    metrics.serve(s.metrics_port)
    worker = Worker(s, tier, model, tier_device(s, tier, device))
    _stop_on_signals(worker.stop)
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

    _stop_on_signals(stop)
    codes = [p.wait() for p in procs]
    return max(codes, default=0)


def cmd_feedback(args: argparse.Namespace) -> int:
    from pipeline.agents.feedback import main as feedback_main

    return feedback_main(_settings(args))


def cmd_up(args: argparse.Namespace) -> int:
    from pipeline.ops.devstack import AGENTS, running_stack, wait_agents_ready

    s = _settings(args)
    if args.data is not None:
        s = s.updated(data_dir=args.data, embedded_durable=True)
    _setup_logging(s)
    stopping = threading.Event()
    _stop_on_signals(stopping.set)
    ports = agent_metrics_ports(s.metrics_port)
    failure: str | None = None
    with running_stack(s, metrics_ports=ports) as stack:
        s = stack.settings
        print(f"tierflow: starting ({_stack_line(s)}); logs {stack.log_dir}/", flush=True)
        took = wait_agents_ready(stack, stopping)
        if took is None:  # stopped, or an agent died while starting: said below
            failure = _dead_agent(stack) if not stopping.is_set() else None
            stopping.set()
        else:
            _print_endpoints(s, stack.log_dir, ports, took)
        restarts: dict[str, list[float]] = {}
        crashed_at: dict[str, list[str]] = {}  # where each agent's batch started when it died, oldest first
        agents = dict(AGENTS)
        while not stopping.wait(0.5):
            for p in stack.dead():
                if p.name not in agents:
                    failure = f"{p.name} exited ({p.popen.returncode}): {last_error_line(stack.tail(p.name, 50))}"
                    stopping.set()
                    break
                recent = [t for t in restarts.get(p.name, []) if time.monotonic() - t < 60]
                tail = stack.tail(p.name, 80)
                at = crash_at(tail)
                history = crashed_at.setdefault(p.name, [])
                history.append(at or "")
                poison = _poison(history)
                if len(recent) >= 5:
                    failure = (f"{p.name} keeps crashing ({len(recent) + 1} exits within a minute): "
                               f"{last_error_line(tail)}; log {p.log_path}" + poison)
                    stopping.set()
                    break
                print(f"tierflow up: {p.name} exited ({p.popen.returncode}): {last_error_line(tail)}; restarting"
                      + poison, file=sys.stderr)
                stack.procs.remove(p)
                stack.start_agent(p.name, *agents[p.name], env=_metrics_env(ports, p.name))
                restarts[p.name] = [*recent, time.monotonic()]
        print("tierflow up: stopping ...", file=sys.stderr)
    if failure:
        print(f"tierflow up: {failure}", file=sys.stderr)
        return 1
    print("tierflow up: stopped", file=sys.stderr)
    return 0


def agent_metrics_ports(base: int | None) -> dict[str, int]:
    """Each agent of `tierflow up` its own /metrics port: `base`, `base`+1, ... in AGENTS order."""
    from pipeline.ops.devstack import AGENTS

    return {} if base is None else {name: base + i for i, (name, _) in enumerate(AGENTS)}


def _metrics_env(ports: dict[str, int], name: str) -> dict[str, str | None]:
    return {"TIERFLOW_METRICS_PORT": str(ports[name]) if name in ports else None}


def _dead_agent(stack: Any) -> str:
    dead = stack.dead()
    if not dead:
        return "agents not ready"
    p = dead[0]
    return f"{p.name} exited ({p.popen.returncode}) while starting: {last_error_line(stack.tail(p.name, 50))}"


def crash_at(log_text: str) -> str | None:
    """Where the batch started that an agent died handling (`topic[partition]@offset`), from its log."""
    from pipeline.adapters.kafka import CRASH_MARK

    for ln in reversed(log_text.splitlines()):
        if CRASH_MARK in ln:
            return ln.split(CRASH_MARK, 1)[1].strip() or None
    return None


def _poison(history: list[str]) -> str:
    """'; a poison record at X ...' when the last crashes all happened on the same input offset."""
    last = history[-1]
    same = 0
    for at in reversed(history):
        if at != last:
            break
        same += 1
    if not last or last == "-" or same < 2:
        return ""
    return f"; a poison record at {last}: it crashed {same} times in a row handling the batch that starts there"


def last_error_line(log_text: str) -> str:
    """The line of a child's log that says why it stopped: the last error line, else its last line."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error:" in ln or "Exception" in ln or " ERROR " in ln or "tierflow " in ln:
            return ln
    return lines[-1] if lines else "(no output)"


def _stack_line(s: Settings) -> str:
    from pipeline.adapters.brokers import embedded_broker
    from pipeline.logs import scrub

    kafka = f"kafka {s.kafka.servers}" + (f" (embedded {embedded_broker(s.embedded.broker).label})"
                                      if s.kafka.embedded else "")
    return f"{kafka}, redis {scrub(s.redis.address)}" + (" (embedded valkey)" if s.redis.embedded else "")


def _print_endpoints(s: Settings, log_dir: Path, ports: dict[str, int], took: dict[str, float]) -> None:
    from pipeline.adapters.brokers import embedded_broker
    from pipeline.logs import scrub

    lines = ["tierflow is up"]
    if s.kafka.embedded:
        b = embedded_broker(s.embedded.broker)
        keep = f"log kept in {s.data_dir}/ ({b.traits.survives_restart})" if s.embedded.durable else \
            "log starts empty each time (--data DIR keeps it)"
        lines.append(f"  kafka   {s.kafka.servers}  (embedded {b.label}; {keep})")
        bounds = [f"{s.topic.retention_ms / 1000:.0f} s"] if s.topic.retention_ms is not None else []
        if s.topic.retention_bytes is not None:
            bounds.append(f"{s.topic.retention_bytes / (1024 * 1024):g} MiB per partition")
        if bounds:
            lines.append(f"          topics keep at most {' or '.join(bounds)}")
    else:
        lines.append(f"  kafka   {s.kafka.servers}")
    lines.append(f"  redis   {scrub(s.redis.address)}" + ("  (embedded valkey)" if s.redis.embedded else ""))
    lines.append("  agents  " + ", ".join(f"{n} {t:.1f}s" for n, t in took.items()) + " to ready")
    if ports:
        lines.append("  metrics " + ", ".join(f"{n} :{p}" for n, p in ports.items()))
    lines += [f"  logs    {log_dir}/", f"  topics  {s.topic.prefix}*"]
    env = "" if (s.kafka.port, s.redis.port) == (DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT) or not s.kafka.embedded \
        else f"TIERFLOW_KAFKA_BOOTSTRAP={s.kafka.servers} TIERFLOW_REDIS_URL={scrub(s.redis.address)} "
    lines.append(f"  try:    {env}tierflow send 'where is my order?' --wait")
    lines.append("  Ctrl-C stops everything.")
    print("\n".join(lines), flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.ops.demo import run_demo

    return run_demo(_settings(args), timeout_s=args.timeout)


def cmd_send(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka import DeliveryTracker, check_reachable, make_producer, topics_of
    from pipeline.contracts.models import dumps

    s = _settings(args)
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
        producer.produce(topics_of(s).requests, dumps(req), key=req.get("user_id") or req["id"], on_delivery=delivery)
        left = producer.flush(args.ack_timeout + 1)
        if left or delivery.failed:
            why = "; ".join(delivery.errors) or f"no acknowledgement within {args.ack_timeout:.0f}s"
            raise ServiceUnavailable(f"{req['id']} was not acknowledged by the broker at {s.kafka.servers}: {why}")
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
    from pipeline.adapters.kafka import check_reachable
    from pipeline.adapters.tails import AnswerReader

    s = _settings(args)
    check_reachable(s.kafka.servers, "Kafka")
    reader = AnswerReader(s, from_beginning=not args.new)
    stopping = threading.Event()
    _stop_on_signals(stopping.set)
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
                    print(_answer_line(ans), flush=True)
            # Without --follow: what existed when the command started, then (--idle) a little more.
            if not args.follow and reader.caught_up and time.monotonic() - idle_since >= args.idle:
                break
    finally:
        reader.close()
    return 0


def _answer_line(ans: dict[str, Any]) -> str:
    timings = ans.get("timings_ms") or {}
    return (f"{ans.get('request_id')!s:<20} {ans.get('tier')!s:<10} {ans.get('intent')!s:<28} "
            f"{timings.get('total', '?')!s:>6}ms  {ans.get('answer')}")


def cmd_thresholds(args: argparse.Namespace) -> int:
    from pipeline.adapters.threshold_store import ThresholdStore
    from pipeline.core.thresholds import parse_value

    s = _settings(args)
    store = ThresholdStore(_redis(s), s.redis.prefix)
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
                  f"esc={doc.escalate_below:<6.3f} {doc.reason}")
    elif args.action == "rollback":
        doc = store.rollback(args.version, who)
        print(f"v{doc.version}: rolled back to the values of v{args.version}")
    return 0


def cmd_vip(args: argparse.Namespace) -> int:
    from pipeline.adapters.threshold_store import ThresholdStore

    s = _settings(args)
    store = ThresholdStore(_redis(s), s.redis.prefix)
    if args.action == "add":
        store.vip_add(*args.users)
    elif args.action == "remove":
        store.vip_remove(*args.users)
    for u in sorted(store.vips()):
        print(u)
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    """Explain a routing decision without touching Kafka (Redis only if reachable)."""
    from pipeline.adapters.threshold_store import ThresholdStore
    from pipeline.contracts.models import Request
    from pipeline.core import features
    from pipeline.core.routing import route
    from pipeline.core.thresholds import Thresholds

    s = _settings(args)
    th, vip, source = Thresholds(), False, "defaults (Redis not reachable)"
    try:
        store = ThresholdStore(_redis(s), s.redis.prefix)
        th, source = store.get(), f"Redis {s.redis.address}"
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

    s = _settings(args)
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
    from workers.train import main as train_main

    argv = ["--data", str(args.data), "--out", str(args.out)]
    if args.test:
        argv += ["--test", str(args.test)]
    return train_main(argv)


def cmd_replay(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka import Tail, check_reachable, topics_of
    from pipeline.agents.replay import (
        FileSource,
        Replayer,
        Source,
        TopicSource,
        accuracy_table,
        job_name,
        parse_offsets,
        parse_when,
        wait_for_results,
    )

    s = _settings(args)
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
BENCHES = ("ingest", "batching", "quality", "pipeline", "article_service", "sustained", "durability", "feedback")


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks in bench/ (a source checkout) and write their sections of BENCHMARKS.md."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "common.py").exists():
        raise ConfigError("tierflow bench runs from a source checkout (the bench/ folder is not installed)")
    chosen = args.only.split(",") if args.only else list(BENCHES)
    unknown = [b for b in chosen if b not in BENCHES]
    if unknown:
        raise ConfigError(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    failed = []
    for name in chosen:
        if not (root / "bench" / f"{name}.py").exists():
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

    return status_main(_settings(args), once=args.once, interval_s=args.interval)


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.ops.report import main as report_main

    return report_main(_settings(args), out_dir=args.out, minutes=args.minutes)


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tierflow",
        description="Hybrid inference on Kafka: route each customer message to the cheapest model tier "
                    "that is good enough.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=func)
        return sp

    def ports(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--kafka-port", type=int, help=_env_help("embedded broker port (19092)",
                                                                 "TIERFLOW_KAFKA_PORT"))
        sp.add_argument("--redis-port", type=int, help=_env_help("embedded Redis port (16379)",
                                                                 "TIERFLOW_REDIS_PORT"))

    def metrics_port(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--metrics-port", type=int, help=_env_help("serve Prometheus /metrics on this port",
                                                                   "TIERFLOW_METRICS_PORT"))

    sp = add("up", cmd_up, "Start the pipeline: embedded broker and Redis (unless TIERFLOW_KAFKA_BOOTSTRAP / "
                           "TIERFLOW_REDIS_URL are set), topics, ingest, one worker per tier, feedback.")
    ports(sp)
    sp.add_argument("--metrics-port", type=int, metavar="BASE",
                    help=_env_help("serve Prometheus /metrics: ingest on BASE, then each worker and the feedback "
                                   "agent on the next ports", "TIERFLOW_METRICS_PORT"))
    sp.add_argument("--data", type=Path, metavar="DIR",
                    help="keep the embedded broker's log in DIR across restarts (default: each start is empty)")
    sp = add("demo", cmd_demo, "Start the embedded pipeline, send sample messages (English and Chinese), "
                               "print their answers and a routing summary, stop.")
    ports(sp)
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for all answers (600)")

    sp = add("topics", cmd_topics, "Create (or list) the pipeline's topics.")
    sp.add_argument("action", choices=["create", "list"])

    sp = add("ingest", cmd_ingest, "Run the ingest agent: validate, tag, route requests to tier topics.")
    metrics_port(sp)
    sp = add("worker", cmd_worker, "Run a tier's worker(s): micro-batch, infer, publish results and answers.")
    sp.add_argument("--tier", required=True, choices=["light", "heavy", "multimodal"])
    sp.add_argument("--device", help=_env_help("cpu, cuda, cuda:N or auto", "TIERFLOW_<TIER>_DEVICE"))
    sp.add_argument("--concurrency", type=int, default=1, help="worker processes in this pool (1)")
    metrics_port(sp)
    sp = add("feedback", cmd_feedback, "Run the feedback agent: windowed stats per tier, threshold control.")
    metrics_port(sp)

    sp = add("send", cmd_send, "Publish one customer message to the requests topic.")
    sp.add_argument("text", nargs="?", help="the message text")
    sp.add_argument("--user", help="user id (VIPs go to the heavy tier)")
    sp.add_argument("--image", help="path of a PNG/JPEG/WebP image to attach")
    sp.add_argument("--lang", help="language hint, e.g. zh or en")
    sp.add_argument("--label", help="ground-truth intent, for evaluation")
    sp.add_argument("--id", help="request id (default: random)")
    sp.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    sp.add_argument("--timeout", type=float, default=60.0, help="with --wait: seconds to wait for the answer (60)")
    sp.add_argument("--ack-timeout", type=float, default=10.0,
                    help="seconds the broker may take to acknowledge the request (10); exit 2 when it does not")

    sp = add("answers", cmd_answers, "Print the answers on the answers topic (each request id once) and exit; "
                                     "--follow keeps printing new ones.")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing new answers until Ctrl-C")
    sp.add_argument("--json", action="store_true", help="one JSON answer per line")
    sp.add_argument("--new", action="store_true", help="only answers that arrive from now on")
    sp.add_argument("--idle", type=float, default=0.0,
                    help="without --follow: once every existing answer is printed, wait this many seconds "
                         "more for new ones (0)")

    sp = add("thresholds", cmd_thresholds, "Show, change, pin, list or roll back the routing thresholds.")
    tsub = sp.add_subparsers(dest="action", required=True)
    tsub.add_parser("show", help="print the current document")
    ts = tsub.add_parser("set", help="set KEY to VALUE (bounds-checked) as a new version")
    ts.add_argument("key")
    ts.add_argument("value")
    ts.add_argument("--reason", help="why (kept in the history)")
    tp = tsub.add_parser("pin", help="pin keys so the feedback controller leaves them alone")
    tp.add_argument("keys", nargs="+")
    tu = tsub.add_parser("unpin", help="let the feedback controller move keys again")
    tu.add_argument("keys", nargs="+")
    th = tsub.add_parser("history", help="every version with who and why")
    th.add_argument("--last", type=int, help="only the last N versions")
    tr = tsub.add_parser("rollback", help="restore the values of VERSION as a new version")
    tr.add_argument("version", type=int)

    sp = add("vip", cmd_vip, "Manage VIP users (their messages go to the heavy tier).")
    sp.add_argument("action", choices=["add", "remove", "list"])
    sp.add_argument("users", nargs="*")

    sp = add("route", cmd_route, "Explain the routing of a message: features, rule, tier (no Kafka).")
    sp.add_argument("text")
    sp.add_argument("--user")
    sp.add_argument("--lang")
    sp.add_argument("--vip", action="store_true", help="treat the user as VIP")
    sp.add_argument("--image", action="store_true", help="as if an image were attached")

    sp = add("fault", cmd_fault, "Chaos testing: inject latency into a tier's workers.")
    sp.add_argument("action", choices=["latency"])
    sp.add_argument("--tier", required=True, choices=["light", "heavy", "multimodal"])
    sp.add_argument("--ms", type=float, required=True, help="extra milliseconds per batch (0 clears)")
    sp.add_argument("--seconds", type=float, help="clear by itself after this many seconds")

    sp = add("replay", cmd_replay, "Replay recorded requests from a topic range or a JSONL/Parquet file through "
                                   "the backfill path (never ahead of live traffic). Resumable and idempotent.")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="JSONL (or .parquet) of request.v1 objects")
    src.add_argument("--topic", help="a topic to read, e.g. tierflow.requests")
    sp.add_argument("--from", dest="start", help="start time (epoch ms or ISO-8601) in --topic")
    sp.add_argument("--to", dest="end", help="end time (inclusive)")
    sp.add_argument("--from-offsets", dest="start_offsets", help="start offsets, e.g. 0:120,1:95")
    sp.add_argument("--to-offsets", dest="end_offsets", help="end offsets (exclusive)")
    sp.add_argument("--rate", type=float, help="at most this many messages per second")
    sp.add_argument("--max-live-slowdown", type=float, default=1.15,
                    help="back off while live p95 is over this multiple of its value before the replay "
                         "(1.15; 0 turns the guard off)")
    sp.add_argument("--limit", type=int, help="at most N records")
    sp.add_argument("--pin-thresholds", type=int, metavar="VERSION", help="route under this threshold version")
    sp.add_argument("--shadow", action="store_true", help="run light and heavy on every record, answer nobody")
    sp.add_argument("--force", action="store_true", help="answer ids a replay already answered")
    sp.add_argument("--job", help="job name (default: derived from the source and range; reruns resume it)")
    sp.add_argument("--restart", action="store_true", help="ignore saved progress and start over")
    sp.add_argument("--wait", type=float, metavar="SECONDS", help="wait for results and print accuracy per tier")

    sp = add("bench", cmd_bench, "Run the benchmarks (bench/) and write BENCHMARKS.md sections with plots.")
    sp.add_argument("--quick", action="store_true", help="reduced sizes: minutes on 2 cores")
    sp.add_argument("--only", help=f"comma list of: {', '.join(BENCHES)}")
    sp.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")

    sp = add("status", cmd_status, "Live terminal view: per-tier throughput, p95, lag, heavy share, thresholds, DLQ.")
    sp.add_argument("--once", action="store_true", help="print one frame and exit")
    sp.add_argument("--interval", type=float, default=1.0, help="seconds between frames (1)")
    sp = add("report", cmd_report, "Write a PNG and a text summary of a run: latency per tier, traffic split, "
                                   "accuracy vs heavy share.")
    sp.add_argument("--out", type=Path, default=Path("report"), help="output directory (./report)")
    sp.add_argument("--minutes", type=float, help="only the last N minutes of results (default: all)")

    sp = add("train", cmd_train, "Train the light, heavy and multilingual heads on a text,category CSV.")
    sp.add_argument("--data", type=Path, required=True, help="training CSV with columns text,category")
    sp.add_argument("--test", type=Path, help="test CSV (default: a held-out split of --data)")
    sp.add_argument("--out", type=Path, default=Path("artifacts"), help="artefact directory (./artifacts)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.settings import unknown_env

    parser = build_parser()
    args = parser.parse_args(argv)
    for warning in unknown_env():
        print(f"tierflow: warning: {warning}", file=sys.stderr)
    try:
        settings = _settings(args)  # a wrong TIERFLOW_* variable raises ConfigError here, one line each
        _setup_logging(settings)
        code: int = args.func(args)
        return code
    except (ServiceUnavailable, ConfigError, InvalidThresholds) as e:
        for line in str(e).splitlines() or [""]:
            print(f"tierflow {args.command}: {line}", file=sys.stderr)
        return 2
    except TierflowError as e:
        print(f"tierflow {args.command}: {e.__class__.__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

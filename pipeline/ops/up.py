"""`tierflow up`: the dev stack under a supervisor that restarts a crashed agent (at most 5 times a minute) and
says when one keeps crashing on the same input (a poison record)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipeline.ops.commands import settings_of, setup_logging, stop_on_signals
from pipeline.settings import DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT, Settings


def cmd_up(args: argparse.Namespace) -> int:
    from pipeline.ops.devstack import agent_env, agents_of, running_stack, wait_agents_ready

    s = settings_of(args)
    if args.data is not None:
        s = s.updated(data_dir=args.data, embedded_durable=True)
    setup_logging(s)
    from workers.models.registry import prepared_writer

    writer, why_not = prepared_writer(s)  # settled once here: each restart of the heavy worker reuses it
    s = s.updated(heavy_generator=writer or "none")
    stopping = threading.Event()
    stop_on_signals(stopping.set)
    ports = agent_metrics_ports(s.metrics_port, s)
    failure: str | None = None
    with running_stack(s, metrics_ports=ports) as stack:
        s = stack.settings
        print(f"tierflow: starting ({_stack_line(s)}); logs {stack.log_dir}/", flush=True)
        took = wait_agents_ready(stack, stopping)
        if took is None:  # stopped, or an agent died while starting: said below
            failure = _dead_agent(stack) if not stopping.is_set() else None
            stopping.set()
        else:
            print_endpoints(s, stack.log_dir, ports, took, why_not)
        restarts: dict[str, list[float]] = {}
        service_exits: dict[str, list[float]] = {}
        crashed_at: dict[str, list[str]] = {}  # where each agent's batch started when it died, oldest first
        agents = dict(agents_of(s))
        while not stopping.wait(0.5):
            for p in stack.dead():
                if p.name not in agents:
                    failure = restart_service(stack, p, service_exits.setdefault(p.name, []), stopping)
                    if failure:
                        stopping.set()
                        break
                    continue
                recent = [t for t in restarts.get(p.name, []) if time.monotonic() - t < 60]
                tail = stack.tail(p.name, 80)
                at = crash_at(tail)
                history = crashed_at.setdefault(p.name, [])
                history.append(at or "")
                poison = poison_note(history)
                if len(recent) >= 5:
                    failure = (f"{p.name} keeps crashing ({len(recent) + 1} exits within a minute): "
                               f"{last_error_line(tail)}; log {p.log_path}" + poison)
                    stopping.set()
                    break
                print(f"tierflow up: {p.name} exited ({p.popen.returncode}): {last_error_line(tail)}; restarting"
                      + poison, file=sys.stderr)
                stack.procs.remove(p)
                stack.start_agent(p.name, *agents[p.name], env=agent_env(s, p.name, ports.get(p.name)))
                restarts[p.name] = [*recent, time.monotonic()]
        print("tierflow up: stopping ...", file=sys.stderr)
    if failure:
        print(f"tierflow up: {failure}", file=sys.stderr)
        return 1
    print("tierflow up: stopped", file=sys.stderr)
    return 0


SERVICE_TRIES = 5  # starts of a dead service, backing off 0.5, 1, 2, 4, 8 s; and its exits a minute before giving up


def restart_service(stack: Any, p: Any, exits: list[float], stopping: threading.Event) -> str | None:
    """Start a dead service (Redis; the broker under --data) again on its port, backing off; None when it runs
    again (or the stack is stopping), else why the stack must stop. The agents ride through the gap: they
    retry Redis and the broker, and restore Redis from the control topic when it comes back empty."""
    from pipeline.errors import ConfigError, ServiceUnavailable

    now = time.monotonic()
    exits[:] = [t for t in exits if now - t < 60] + [now]
    why = last_error_line(stack.tail(p.name, 50))
    if len(exits) > SERVICE_TRIES:
        return f"{p.name} keeps exiting ({len(exits)} times within a minute): {why}; log {p.log_path}"
    why_not = stack.not_restartable(p.name)
    if why_not:
        return f"{p.name} exited ({p.popen.returncode}): {why}; not started again: {why_not}"
    print(f"tierflow up: {p.name} exited ({p.popen.returncode}): {why}; starting it again", file=sys.stderr)
    last: Exception | None = None
    for attempt in range(SERVICE_TRIES):
        if stopping.wait(0.5 * 2 ** attempt):
            return None
        try:
            stack.restart(p.name)
        except (ConfigError, ServiceUnavailable) as e:
            last = e
            continue
        print(f"tierflow up: {p.name} is back on its port", file=sys.stderr)
        return None
    return f"{p.name} exited ({p.popen.returncode}): {why}; not started again: {last}"


def agent_metrics_ports(base: int | None, s: Settings) -> dict[str, int]:
    """Each agent of `tierflow up` its own /metrics port: `base`, `base`+1, ... in `agents_of` order."""
    from pipeline.ops.devstack import agents_of

    return {} if base is None else {name: base + i for i, (name, _) in enumerate(agents_of(s))}


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


def poison_note(history: list[str]) -> str:
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


def print_endpoints(s: Settings, log_dir: Path, ports: dict[str, int], took: dict[str, float],
                    no_writer: str = "") -> None:
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
    from pipeline.ops.devstack import thread_budget

    cpus, budget = thread_budget(s)
    lines.append(f"  cores   {cpus} (TIERFLOW_CPUS) shared by the models: "
                 + ", ".join(f"{n} {t}" for n, t in budget.items() if n.startswith("worker") or n == "trainer")
                 + " threads")
    writer = s.heavy.generator if s.heavy.generator not in (None, "", "none") else None
    lines.append(f"  writer  {writer} writes heavy answers within {s.generator.timeout_s:g} s of a message's "
                 "arrival, while no queue builds behind it; else the policy text at once" if writer else
                 f"  writer  none: heavy answers are the policy text ({no_writer or 'TIERFLOW_HEAVY_GENERATOR=none'})")
    if ports:
        lines.append("  metrics " + ", ".join(f"{n} :{p}" for n, p in ports.items()))
    lines += [f"  logs    {log_dir}/", f"  topics  {s.topic.prefix}*"]
    if s.learn.enabled:
        lines.append("  learn   the light model learns from heavy's answers: tierflow models list")
    env = "" if (s.kafka.port, s.redis.port) == (DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT) or not s.kafka.embedded \
        else f"TIERFLOW_KAFKA_BOOTSTRAP={s.kafka.servers} TIERFLOW_REDIS_URL={scrub(s.redis.address)} "
    lines.append(f"  try:    {env}tierflow send 'where is my order?' --wait")
    lines.append("  Ctrl-C stops everything.")
    print("\n".join(lines), flush=True)

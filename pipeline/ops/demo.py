"""`tierflow demo`: the whole pipeline on the embedded stack, with sample customer messages."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import orjson
import redis
from rich.console import Console
from rich.table import Table

from pipeline.adapters.heartbeats import ready_tiers
from pipeline.adapters.kafka import make_producer, topics_of
from pipeline.adapters.redis_client import make_redis
from pipeline.adapters.tails import AnswerReader
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.contracts.topics import Tier
from pipeline.ops.devstack import Stack, free_port, port_open, running_stack
from pipeline.ops.samples import CONVERSATIONS, VIP_USER, requests
from pipeline.settings import Settings
from workers.models.registry import prepared_writer


def wait_ready(stack: Stack, r: redis.Redis, prefix: str, timeout_s: float, console: Console) -> None:
    """Until every tier has a live worker (models loaded and warmed up)."""
    deadline = time.monotonic() + timeout_s
    with console.status("loading models (first start can take a minute) ...") as status:
        while True:
            ready = ready_tiers(r, prefix, [t.value for t in Tier])
            status.update(f"loading models ... ready: {', '.join(ready) or 'none yet'}")
            if len(ready) == len(Tier):
                return
            dead = stack.dead()
            if dead:
                raise RuntimeError(f"{dead[0].name} exited ({dead[0].popen.returncode}):\n{stack.tail(dead[0].name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout_s:.0f}s (ready: {ready})")
            time.sleep(0.5)


def run_demo(settings: Settings, timeout_s: float = 600.0) -> int:
    console = Console()
    updates: dict[str, Any] = {"data_dir": settings.data_dir / "demo"}
    if settings.kafka.embedded and port_open("127.0.0.1", settings.kafka.port):
        updates["kafka_port"] = free_port()  # a `tierflow up` may be running: don't fight over its port
    if settings.redis.embedded and port_open("127.0.0.1", settings.redis.port):
        updates["redis_port"] = free_port()
    writer, why_not = prepared_writer(settings)
    updates["heavy_generator"] = writer or "none"
    if writer is not None and "TIERFLOW_GENERATOR_TIMEOUT_S" not in os.environ:
        # The demo's few heavy messages arrive in one batch, and a 1.5B model on a laptop's CPU writes one
        # reply in ~5-10 s: give the batch time rather than show templates.
        updates["generator_timeout_s"] = 120.0
    if writer is not None and "TIERFLOW_GENERATOR_MAX_HELD" not in os.environ:
        updates["generator_max_held"] = 100.0  # nobody else waits behind the demo's batch: write all of it
    s = settings.updated(**updates)
    started = time.monotonic()
    with running_stack(s) as stack:
        console.print(f"[bold]tierflow demo[/bold]: broker {s.kafka.servers}, Redis {s.redis.address}, "
                      f"logs {stack.log_dir}/; domain {s.domain}; heavy answers "
                      + (f"written by {writer}" if writer else f"from templates ({why_not})"))
        r = make_redis(s, command=True)
        ThresholdStore.of(s, r).vip_add(VIP_USER)
        reader = AnswerReader(s)
        try:
            wait_ready(stack, r, s.redis.prefix, timeout_s, console)
            console.print(f"pipeline ready in {time.monotonic() - started:.1f}s; sending {len(requests())} messages")
            answers = _send_and_collect(s, reader, timeout_s, console)
            talks = _converse(s, reader, timeout_s, console)
        finally:
            reader.close()
    _print(console, answers, writer)
    _print_conversations(console, talks, writer)
    missing = [q["id"] for q in requests() if q["id"] not in answers]
    missing += [rid for _, turns in talks for rid, _, a in turns if a is None]
    if missing:
        console.print(f"[red]no answer for {', '.join(missing)}[/red]")
        return 1
    return 0


Talk = list[tuple[str, list[tuple[str, str, Any]]]]  # per customer: (id, text, answer) per turn


def _converse(s: Settings, reader: AnswerReader, timeout_s: float, console: Console) -> Talk:
    """The sample conversations, each turn sent once the one before it is answered."""
    producer = make_producer(s)
    topic = topics_of(s).requests
    out: Talk = []
    with console.status("conversations ...") as status:
        for user, texts in CONVERSATIONS:
            turns: list[tuple[str, str, Any]] = []
            for i, text in enumerate(texts, 1):
                rid = f"demo-{user}-t{i}"
                producer.produce(topic, orjson.dumps({"id": rid, "user_id": user, "text": text,
                                                      "ts": int(time.time() * 1000)}), key=user)
                producer.flush(10)
                status.update(f"conversation {user}: turn {i}")
                got = None
                deadline = time.monotonic() + timeout_s
                while got is None and time.monotonic() < deadline:
                    got = next((a for a in reader.poll(0.2) if a["request_id"] == rid), None)
                turns.append((rid, text, got))
            out.append((user, turns))
    return out


def _print_conversations(console: Console, talks: Talk, writer: str | None) -> None:
    for user, turns in talks:
        console.print(f"[bold]conversation {user}[/bold] (each turn sent once the one before was answered):")
        for _, text, a in turns:
            if a is None:
                console.print(f"  {text}  [red]no answer[/red]", highlight=False)
                continue
            used = ", ".join(a.get("context_used") or []) or "nothing"
            console.print(f"  turn {a.get('turn', '?')}: {text}\n    -> {a['tier']}, {a['intent']} (the conversation "
                          f"used: {used}{_how(a, writer)}): {_short(a['answer'], 240)}", highlight=False)


def _send_and_collect(s: Settings, reader: AnswerReader, timeout_s: float, console: Console) -> dict[str, Any]:
    reqs = requests()
    producer = make_producer(s)
    topic = topics_of(s).requests
    for q in reqs:
        q["ts"] = int(time.time() * 1000)
        producer.produce(topic, orjson.dumps(q), key=q.get("user_id") or q["id"])
    producer.flush(10)
    want = {q["id"] for q in reqs}
    got: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    with console.status("waiting for answers ...") as status:
        while want - set(got) and time.monotonic() < deadline:
            for ans in reader.poll(0.5):
                if ans["request_id"] in want:
                    got[str(ans["request_id"])] = ans
            status.update(f"waiting for answers ... {len(got)}/{len(want)}")
    return got


def _print(console: Console, answers: dict[str, Any], writer: str | None) -> None:
    reqs = requests()
    texts = {q["id"]: q.get("text", "") for q in reqs}
    cases = {q["id"]: q["meta"]["case"] for q in reqs}
    wide = console.width >= 140
    table = Table(title="answers", show_lines=False)
    table.add_column("id", no_wrap=True, min_width=2)
    table.add_column("case", no_wrap=True, min_width=5)
    table.add_column("message", overflow="ellipsis", no_wrap=True, max_width=40 if wide else 16)
    table.add_column("tier", no_wrap=True, min_width=16)  # "heavy+esc→person"
    table.add_column("rule", no_wrap=True, min_width=6)
    if wide:
        table.add_column("model", no_wrap=True)
    table.add_column("intent", overflow="ellipsis", no_wrap=True, max_width=28 if wide else 16)
    table.add_column("conf", justify="right", no_wrap=True, min_width=4)
    table.add_column("ms", justify="right", no_wrap=True, min_width=5)
    for rid in sorted(answers):
        a = answers[rid]
        tier = (a["tier"] + ("+esc" if a["escalated"] else "") + ("+deg" if a["degraded"] else "")
                + ("→person" if a.get("handover") else ""))
        row = [rid.removeprefix("demo-"), cases.get(rid, ""), _short(texts.get(rid, ""), 60), tier,
               a["route_reason"].split(":")[0]]
        if wide:
            row.append(a["model"])
        row += [a["intent"], f"{a['confidence']:.2f}", str(a["timings_ms"]["total"])]
        table.add_row(*row)
    console.print(table)
    for rid in sorted(answers):
        a = answers[rid]
        console.print(f"[bold]{rid}[/bold] ({a['model']}{_how(a, writer)}): {_short(a['answer'], 320)}",
                      highlight=False)
    split = Counter(a["tier"] for a in answers.values())
    reasons = Counter(a["route_reason"] for a in answers.values())
    esc = sum(1 for a in answers.values() if a["escalated"])
    handed = sum(1 for a in answers.values() if a.get("handover"))
    console.print("routing summary: " + ", ".join(f"{t}={n}" for t, n in sorted(split.items()))
                  + f"; escalated={esc}; handed over={handed}; rules: "
                  + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))


def _how(a: dict[str, Any], writer: str | None) -> str:
    """How a heavy answer was worded: written by the generator, or the template and why; or that it was handed
    over to a person (the customer has the holding message)."""
    if a.get("handover"):
        return f"; handed over to a person ({a.get('handover_reason', '?')}): holding message"
    if a["tier"] != "heavy":
        return ""
    if a.get("fallback"):
        return f"; template: the writer's reply was not sent ({a.get('fallback_reason', '?')})"
    if writer is None:
        return "; template: no writer (TIERFLOW_HEAVY_GENERATOR=none, or the packaged one is not installed)"
    return f"; written by {writer}" if "+" in a["model"] else "; template"


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"

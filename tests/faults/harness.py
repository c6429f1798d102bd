"""The fault suite's harness: real agent processes, traffic, an outside observer and the invariant check.

Everything here looks at the pipeline from the outside, as a customer or an operator would: requests go
into the requests topic, answers and dead letters are read back from their topics by a consumer of the
test's own, processes are real children (`tierflow ingest`, `tierflow worker`, `tierflow up`), and
memory is read from /proc. Nothing reaches into an agent's state.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from pipeline.adapters.dlq import headers_dict
from pipeline.adapters.kafka import Headers, make_consumer, make_producer, topics_of
from pipeline.adapters.tails import Deduper
from pipeline.ops.devstack import AGENTS, Stack
from pipeline.settings import Settings

# Every tier answers with the echo backend: the suite measures the pipeline, not a model.
ECHO = {"TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_HEAVY_MODEL": "echo", "TIERFLOW_MULTIMODAL_MODEL": "echo",
        "TIERFLOW_ZH_MODEL": ""}
AGENT_ARGS: dict[str, tuple[str, ...]] = dict(AGENTS)

SHORT_TEXTS = ("my card has not arrived", "How do I reset my PIN?", "我的卡还没有收到", "refund please")
MEDIUM_TEXT = "my card payment was declined at the shop today, why?"  # 52 characters
LONG_TEXT = ("I want a refund for a purchase I never made, the shop charged me twice and will not answer "
             "my emails")  # > 50 characters: heavy under the default length_threshold
# A real 8x8 white PNG (made by Pillow): the echo multimodal worker never decodes it, the OCR one reads no text.
TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAFUlEQVR4nGP8//8/AzbAhFV00EoAAFbUAw037MyjAAAAAElFTkSuQmCC"


def request(rid: str, kind: str) -> bytes:
    """A valid request.v1 of `kind`: 'light' (short text), 'heavy' (long text), 'medium' (52 characters: heavy
    under the default length_threshold of 50, light above 52) or 'image'."""
    if kind == "medium":
        return orjson.dumps({"id": rid, "text": MEDIUM_TEXT})
    if kind == "heavy":
        return orjson.dumps({"id": rid, "text": LONG_TEXT, "user_id": f"u{rid[-3:]}"})
    if kind == "image":
        return orjson.dumps({"id": rid, "text": "see the photo", "image": {"data": TINY_PNG, "mime": "image/png"}})
    return orjson.dumps({"id": rid, "text": SHORT_TEXTS[hash(rid) % len(SHORT_TEXTS)]})


# --------------------------------------------------------------------------- processes
def rss_kib(pid: int) -> int:
    """Resident memory of `pid` in KiB (VmRSS from /proc), 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class RssSampler:
    """Samples the resident memory of named processes every `interval_s`; keeps the peak per name."""

    def __init__(self, pids: Callable[[], dict[str, int]], interval_s: float = 0.25) -> None:
        self.pids, self.interval_s = pids, interval_s
        self.peak_kib: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="rss")

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, pid in self.pids().items():
                self.peak_kib[name] = max(self.peak_kib[name], rss_kib(pid))
            self.samples += 1

    def peak_mib(self) -> dict[str, float]:
        return {k: round(v / 1024, 1) for k, v in sorted(self.peak_kib.items())}


class Agents:
    """Agents of one pipeline as child processes of the test (`tierflow ingest`, `tierflow worker ...`)."""

    def __init__(self, settings: Settings, env: dict[str, str] | None = None) -> None:
        self.s = settings
        self.env = {**ECHO, **(env or {})}
        self.stack = Stack(settings)

    def start(self, *names: str) -> Agents:
        for name in names:
            self.stack.start_agent(name, *AGENT_ARGS[name], env=self.env)
        return self

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self.stack.procs if p.popen.poll() is None}

    def dead(self) -> list[str]:
        """Names of agents that exited (none should, whatever the input)."""
        return [f"{p.name} (exit {p.popen.returncode})" for p in self.stack.dead()]

    def kill(self, name: str) -> None:
        self.stack.kill(name, signal.SIGKILL)

    def log(self, name: str) -> str:
        path = self.stack.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.stack.stop()


class Up:
    """`tierflow up` as a child process, against the test's broker and Redis: it starts the agents and
    restarts any that dies, exactly as an operator runs it."""

    def __init__(self, settings: Settings, env: dict[str, str] | None = None,
                 base_env: dict[str, str] | None = None) -> None:
        self.s = settings
        self.stack = Stack(settings)
        self.env = {**ECHO, "TIERFLOW_DATA_DIR": str(settings.data_dir), **(env or {})}
        if base_env is None:  # dial the test's services
            self.proc = self.stack.start_agent("up", "up", env=self.env)
        else:  # exactly this environment (e.g. without TIERFLOW_KAFKA_BOOTSTRAP: `up` embeds its own broker)
            self.proc = self.stack.spawn("up", [sys.executable, "-m", "pipeline.cli", "up"],
                                         env={**base_env, **self.env})

    def agents(self) -> dict[str, int]:
        """name -> pid of the agents `up` is running now (its children, by command line)."""
        out: dict[str, int] = {}
        for pid in _children(self.proc.popen.pid):
            argv = _cmdline(pid)
            if "pipeline.cli" not in argv:
                continue
            args = tuple(argv[argv.index("pipeline.cli") + 1:])
            for name, agent_args in AGENT_ARGS.items():
                if args == agent_args:
                    out[name] = pid
        return out

    def kill(self, name: str, timeout: float = 30.0) -> float:
        """kill -9 agent `name`; wait until `up` has started a new one. Returns the seconds that took."""
        old = self.agents()[name]
        os.killpg(old, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            new = self.agents().get(name)
            if new is not None and new != old:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise TimeoutError(f"tierflow up did not restart {name} within {timeout:.0f}s:\n{self.output()}")

    def alive(self) -> bool:
        return self.proc.popen.poll() is None

    def wait_up(self, timeout: float = 120.0) -> None:
        """Until `up` says "tierflow is up" (every agent ready): an agent killed before that is one that died while
        starting, and `up` stops rather than restart it."""
        deadline = time.monotonic() + timeout
        while "tierflow is up" not in self.stack.tail("up", 400):
            assert self.alive() and time.monotonic() < deadline, self.output()
            time.sleep(0.1)

    def output(self) -> str:
        return self.stack.tail("up", 40)

    def stop(self) -> None:
        self.stack.stop(timeout=20)


class PidWatch:
    """Counts restarts of named processes (a new pid under a known name) by polling `pids` in a thread."""

    def __init__(self, pids: Callable[[], dict[str, int]], interval_s: float = 0.2) -> None:
        self.pids, self.interval_s = pids, interval_s
        self.last: dict[str, int] = {}
        self.restarts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="pidwatch")

    def __enter__(self) -> PidWatch:
        self.last = self.pids()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, pid in self.pids().items():
                if name in self.last and self.last[name] != pid:
                    self.restarts[name] += 1
                self.last[name] = pid


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def cli(settings: Settings, *args: str, timeout: float = 60.0) -> str:
    """Run `tierflow ARGS` against this pipeline's services; return its stdout."""
    env = {**os.environ, **settings.with_env()}
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True, text=True,
                         timeout=timeout, check=True)
    return out.stdout


# --------------------------------------------------------------------------- traffic
Coords = tuple[str, int, int]  # (topic, partition, offset) of a record, as its delivery report gave them


@dataclass
class Sent:
    """What the test asked the broker to take, and what it acknowledged.

    Ids are the test's logical names for records. Most records carry their id as their key; a record sent with
    an `Envelope` of its own (a hostile key) is found on the DLQ by its coordinates instead (`coords`).
    """

    valid: dict[str, str] = field(default_factory=dict)  # request id -> kind
    invalid: dict[str, str] = field(default_factory=dict)  # record key (or logical id) -> poison category
    acked: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # id/key -> delivery error
    sent_at: dict[str, float] = field(default_factory=dict)  # id/key -> time.monotonic() of produce()
    coords: dict[str, Coords] = field(default_factory=dict)  # id/key -> where the broker wrote it

    def on_delivery(self, key: str) -> Callable[[KafkaError | None, Message], None]:
        def cb(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self.acked.add(key)
                self.coords[key] = (msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
            else:
                self.failed[key] = err.str()
        return cb


@dataclass(frozen=True)
class Envelope:
    """A record's key and headers when they are not simply its logical id as the key (hostile records)."""

    key: bytes | None
    headers: Headers | None = None
    label: str = ""  # what is hostile about it, e.g. "key:binary+headers:many"


def send(producer: Producer, topic: str, key: str, value: bytes | None, sent: Sent,
         envelope: Envelope | None = None) -> None:
    """Produce `value` under the logical id `key`: as its key, or with `envelope`'s key and headers."""
    sent.sent_at[key] = time.monotonic()
    wire_key = key.encode() if envelope is None else envelope.key
    headers = None if envelope is None else envelope.headers
    while True:
        try:
            producer.produce(topic, value, key=wire_key, headers=headers, on_delivery=sent.on_delivery(key))
            break
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)


class Traffic:
    """Valid requests at `rate`/s in a thread until `total` are sent; ids `{tag}-{n}`, kinds by `mix`."""

    def __init__(self, settings: Settings, tag: str, total: int, rate: float,
                 mix: Sequence[tuple[str, float]] = (("light", 0.6), ("heavy", 0.35), ("image", 0.05)),
                 sent: Sent | None = None, seed: int = 0, producer_conf: dict[str, Any] | None = None) -> None:
        self.s, self.tag, self.total, self.rate = settings, tag, total, rate
        self.sent = sent or Sent()
        self.rng = random.Random(seed)
        self.kinds, self.weights = zip(*mix, strict=True)
        self.producer: Producer | None = make_producer(settings, **(producer_conf or {}))
        self.done = threading.Event()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="traffic")
        self.started = 0.0

    def __enter__(self) -> Traffic:
        self.started = time.monotonic()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(30)

    @property
    def duration_s(self) -> float:
        return self.total / self.rate

    def wait(self, timeout: float) -> None:
        if not self.done.wait(timeout):
            raise TimeoutError(f"traffic: sent {len(self.sent.valid)} of {self.total}")

    def _run(self) -> None:
        topic = topics_of(self.s).requests
        producer = self.producer
        assert producer is not None
        t0 = time.monotonic()
        for n in range(self.total):
            if self._stop.is_set():
                break
            rid = f"{self.tag}-{n}"
            kind = self.rng.choices(self.kinds, self.weights)[0]
            self.sent.valid[rid] = kind
            send(producer, topic, rid, request(rid, kind), self.sent)
            ahead = (n + 1) / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        # librdkafka retries through a broker restart: wait for every delivery report.
        producer.flush(120)
        self.producer = None  # gone with the test's broker: no reconnect attempts after the test
        self.done.set()


# --------------------------------------------------------------------------- the outside view
@dataclass(frozen=True, slots=True)
class Seen:
    """One answer as read from the answers topic."""

    request_id: str
    tier: str
    degraded: bool
    route_reason: str
    answered_at: int
    threshold_version: int
    total_ms: int


@dataclass(frozen=True, slots=True)
class Dead:
    """One dead letter: its key, reason headers, stage and where its record came from (x-source-*)."""

    key: str
    kind: str
    error: str
    stage: str
    source: Coords | None = None  # (x-source-topic, x-source-partition, x-source-offset)


class Observer:
    """Reads the answers and dead-letter topics from the beginning, in a thread, with a group of its own."""

    def __init__(self, settings: Settings) -> None:
        t = topics_of(settings)
        self.answers_topic, self.dlq_topic = t.answers, t.dlq
        self.consumer: Consumer = make_consumer(settings, f"faults-observer-{uuid.uuid4().hex[:8]}")
        self.consumer.subscribe([t.answers, t.dlq])
        self.answers: list[Seen] = []
        self.dead: list[Dead] = []
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="observer")

    def __enter__(self) -> Observer:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)
        self.consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = self.consumer.consume(2000, 0.2)
            seen, dead = [], []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        self.errors[err.name()] += 1
                    continue
                if m.topic() == self.answers_topic:
                    a = orjson.loads(m.value() or b"{}")
                    seen.append(Seen(str(a["request_id"]), a["tier"], bool(a["degraded"]), a["route_reason"],
                                     int(a["answered_at"]), int(a["threshold_version"]),
                                     int(a["timings_ms"]["total"])))
                else:
                    h = headers_dict(m)
                    dead.append(Dead((m.key() or b"").decode("utf-8", "replace"), h.get("x-error-kind", ""),
                                     h.get("x-error", ""), h.get("x-stage", ""), _source(h)))
            if seen or dead:
                with self._lock:
                    self.answers.extend(seen)
                    self.dead.extend(dead)

    def answered_ids(self) -> set[str]:
        with self._lock:
            return {a.request_id for a in self.answers}

    def dead_keys(self) -> set[str]:
        with self._lock:
            return {d.key for d in self.dead}

    def dead_coords(self) -> set[Coords]:
        """Where the dead-lettered records came from (their x-source-* headers)."""
        with self._lock:
            return {d.source for d in self.dead if d.source is not None}

    def dead_by_source(self) -> dict[Coords, Dead]:
        """The last dead letter of each source record, by its coordinates."""
        with self._lock:
            return {d.source: d for d in self.dead if d.source is not None}

    def wait_for(self, sent: Sent, timeout: float, settle_s: float = 2.0) -> float:
        """Until every acknowledged valid id is answered and every acknowledged invalid key is dead-lettered
        (by its key or its coordinates; or `timeout`), then `settle_s` more for late duplicates. Returns the
        seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            valid = {i for i in sent.valid if i in sent.acked}
            invalid = {k for k in sent.invalid if k in sent.acked}
            if valid <= self.answered_ids() and not _missing(invalid, sent, self.dead_keys(), self.dead_coords()):
                break
            time.sleep(0.2)
        waited = time.monotonic() - t0
        time.sleep(settle_s)
        return waited


def _source(h: dict[str, str]) -> Coords | None:
    """A dead letter's x-source-topic/partition/offset, None where they are absent or not numbers."""
    try:
        return h["x-source-topic"], int(h["x-source-partition"]), int(h["x-source-offset"])
    except (KeyError, ValueError):
        return None


def _missing(ids: set[str], sent: Sent, keys: set[str], coords: set[Coords]) -> set[str]:
    """The ids in `ids` on the DLQ neither by their key nor by their coordinates."""
    return {i for i in ids if i not in keys and sent.coords.get(i) not in coords}


# --------------------------------------------------------------------------- invariants
@dataclass
class Verdict:
    """The outside view of a run against what was sent."""

    sent_valid: int
    sent_invalid: int
    not_acked: int
    answered: int
    raw_answers: int
    duplicates: int
    duplicate_bound: int | None
    lost: list[str]
    unexpected: list[str]
    dead_lettered: int
    invalid_missing: list[str]
    valid_dead: list[str]
    dead_without_reason: int
    by_tier: dict[str, int]
    dead_by_kind: dict[str, int]
    dead_by_stage: dict[str, int]

    @property
    def violations(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} valid requests never answered, e.g. {self.lost[:5]}")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} answers for ids never sent as valid, e.g. {self.unexpected[:5]}")
        if self.invalid_missing:
            out.append(f"{len(self.invalid_missing)} invalid records missing from the DLQ, "
                       f"e.g. {self.invalid_missing[:5]}")
        if self.valid_dead:
            out.append(f"{len(self.valid_dead)} valid requests dead-lettered, e.g. {self.valid_dead[:5]}")
        if self.dead_without_reason:
            out.append(f"{self.dead_without_reason} dead letters without x-error / x-error-kind")
        if self.duplicate_bound is not None and self.duplicates > self.duplicate_bound:
            out.append(f"{self.duplicates} duplicate answers, more than the bound {self.duplicate_bound}")
        return out

    @property
    def held(self) -> bool:
        return not self.violations


def verify(sent: Sent, obs: Observer, duplicate_bound: int | None = None) -> Verdict:
    """Every acknowledged valid id answered exactly once after dedupe, every invalid one dead-lettered with a
    reason (found by its key or by its coordinates), nothing else; raw duplicates within `duplicate_bound`."""
    valid = {i for i in sent.valid if i in sent.acked}
    invalid = {k for k in sent.invalid if k in sent.acked}
    with obs._lock:
        answers = list(obs.answers)
        dead = list(obs.dead)
    dedupe = Deduper()
    firsts = [a for a in answers if dedupe.first(a.request_id)]
    answered = {a.request_id for a in firsts}
    dead_keys = {d.key for d in dead}
    dead_coords = {d.source for d in dead if d.source is not None}
    missing = _missing(invalid, sent, dead_keys, dead_coords)
    return Verdict(
        sent_valid=len(sent.valid), sent_invalid=len(sent.invalid),
        not_acked=len(sent.valid) + len(sent.invalid) - len(valid) - len(invalid),
        answered=len(answered), raw_answers=len(answers), duplicates=dedupe.duplicates,
        duplicate_bound=duplicate_bound,
        lost=sorted(valid - answered), unexpected=sorted(answered - valid),
        dead_lettered=len(invalid - missing), invalid_missing=sorted(missing),
        valid_dead=sorted(valid - _missing(valid, sent, dead_keys, dead_coords)),
        dead_without_reason=sum(1 for d in dead if not d.error or not d.kind),
        by_tier=dict(Counter(a.tier for a in firsts)),
        dead_by_kind=dict(Counter(d.kind for d in dead)),
        dead_by_stage=dict(Counter(d.stage.split(":")[0] if d.stage.startswith("ingest") else d.stage
                                   for d in dead)),
    )


def trace(settings: Settings, ids: Sequence[str], timeout: float = 20.0) -> dict[str, list[str]]:
    """Where each id went: every record on every tierflow topic whose key is the id or whose value names it,
    read from the beginning, aborted transactions included (read_uncommitted). For a lost id this tells a
    pipeline that dropped it (it stops at some topic) from an observer that missed it (it is on the answers
    topic)."""
    wanted = {i: i.encode() for i in ids}
    found: dict[str, list[str]] = {i: [] for i in ids}
    if not ids:
        return found
    c = make_consumer(settings, f"faults-trace-{uuid.uuid4().hex[:8]}", None,
                       **{"isolation.level": "read_uncommitted", "enable.partition.eof": True})
    try:
        parts = []
        for topic, meta in c.list_topics(timeout=10).topics.items():
            if topic.startswith(settings.topic.prefix):
                parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        c.assign(parts)
        pending, deadline = {(tp.topic, tp.partition) for tp in parts}, time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for m in c.consume(5000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard((m.topic() or "", m.partition() or 0))
                    continue
                key, value = m.key() or b"", m.value() or b""
                for i, b in wanted.items():
                    if key == b or b'"' + b + b'"' in value:
                        found[i].append(f"{m.topic()}[{m.partition()}]@{m.offset()} key={key[:40]!r} "
                                        f"{value[:160]!r}")
        if pending:
            found["(not read to the end)"] = sorted(f"{t}[{p}]" for t, p in pending)
    finally:
        c.close()
    return found


def batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for it in items:
        batch.append(it)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch

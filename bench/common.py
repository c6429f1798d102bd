"""Shared benchmark plumbing: machine description, BENCHMARKS.md section writing, and the answer reader."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import NewTopic

from pipeline.adapters.doorbell import Bell
from pipeline.adapters.kafka import (
    OrderedConsumer,
    create_topics,
    delete_topics,
    make_admin,
    make_consumer,
    poll_batch,
    specs_of,
    topics_of,
)
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"

# The default (shop) pack's own customer messages, a third Chinese and a third over 50 characters: what the
# product benches send, so each message is in scope for the models that answer it.
SHOP_TEXTS = ["where is my order?", "how much does the 128GB model cost?", "我想退货退款",
              "My phone screen cracked after two days and the seller refuses to repair it under warranty",
              "怎么修改收货地址？",
              "I was charged twice for the same order yesterday, please refund one of the payments"]


def machine() -> str:
    """Cores, CPU model, memory and GPU (if any), in one line."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.findall(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[0])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, IndexError):
        pass
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} cores ({cpu}){mem}, {gpu}, Python {platform.python_version()}"


def command() -> str:
    """The command line that is running, as a user would type it."""
    prog = Path(sys.argv[0])
    argv = sys.argv[1:]
    main_mod = sys.modules.get("__main__")
    spec = getattr(main_mod, "__spec__", None)
    if spec is not None and spec.name:  # run as `python -m bench.x`
        return shlex.join(["python", "-m", spec.name, *argv])
    if prog.suffix == ".py":
        return shlex.join(["python", str(prog.relative_to(ROOT) if prog.is_absolute() and ROOT in prog.parents
                                         else prog), *argv])
    return shlex.join([prog.name, *argv])


def recorded(title: str, row: str, column: int, path: Path = BENCHMARKS) -> float | None:
    """A number another benchmark wrote: `column` (0 = first cell) of the table row starting `| row` in
    section `## title` of BENCHMARKS.md; None when that section or row is not there."""
    if not path.exists():
        return None
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", path.read_text(), re.S | re.M)
    for line in (m.group(1).splitlines() if m else []):
        if line.startswith(f"| {row}"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            try:
                return float(cells[column].replace(",", "").split()[0])
            except (IndexError, ValueError):
                return None
    return None


def write_section(title: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace (or append) the `## title` section of BENCHMARKS.md with `body` plus provenance."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"## {title}\n\n"
               f"Command: `{command()}`  \nMachine: {machine()} (host {socket.gethostname()})  \nDate: {stamp}\n\n"
               f"{body.strip()}\n")
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEvery section is written by the command it names.\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    found = pattern.search(text)
    text = pattern.sub(lambda _: section + "\n", text) if found else text.rstrip() + "\n\n" + section
    path.write_text(text.rstrip() + "\n")


@contextlib.contextmanager
def run_dir(tag: str) -> Iterator[Path]:
    """A data directory of this run's own (`.tierflow/bench-TAG-xxxxxx`): two benchmarks running at once (the test
    suite's two broker passes run every benchmark on a tiny sample side by side) must not wipe each other's broker
    log. Removed when the run ends well; kept, with the agents' logs, when it raised."""
    path = Path(f".tierflow/bench-{tag}-{uuid.uuid4().hex[:6]}")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def embedded_services() -> Iterator[Settings]:
    """A broker and a Redis of the benchmark's own, on free ports; yields settings that dial them."""
    with run_dir("services") as data:
        base = Settings(kafka_port=free_port(), redis_port=free_port(), data_dir=data)
        stack = Stack(base)
        stack.start_services()
        try:
            yield stack.settings.updated(kafka_bootstrap=base.kafka.servers, redis_url=base.redis.address)
        finally:
            stack.stop()


@dataclass
class Up:
    """A `tierflow up` started by a benchmark: its process, the environment its commands need, and its banner."""

    proc: subprocess.Popen[str]
    env: dict[str, str]
    ready_s: float  # from start to "Ctrl-C stops everything"
    banner: list[str]


@contextlib.contextmanager
def tierflow_up(tag: str, extra_env: Mapping[str, str] | None = None) -> Iterator[Up]:
    """A fresh `tierflow up` as a user starts it: default settings (no TIERFLOW_* from this environment) but
    `extra_env`, free ports, a data dir of its own (removed at the end). Yields once it says it is up; stopped
    (SIGTERM, as Ctrl-C) on exit."""
    data = Path(f".tierflow/bench-{tag}-{uuid.uuid4().hex[:6]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERFLOW_")}
    env.update(TIERFLOW_KAFKA_PORT=str(free_port()), TIERFLOW_REDIS_PORT=str(free_port()),
               TIERFLOW_DATA_DIR=str(data), **(extra_env or {}))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    banner: list[str] = []
    try:
        while True:
            line = proc.stdout.readline()
            banner.append(line)
            if "Ctrl-C stops everything" in line or not line:
                break
        if proc.poll() is not None:
            raise SystemExit("tierflow up did not start:\n" + "".join(banner[-20:]))
        yield Up(proc, env, time.monotonic() - t0, banner)
    finally:
        proc.terminate()
        proc.wait(90)
        shutil.rmtree(data, ignore_errors=True)  # the broker's log and the agents' logs of this run


def fresh_topics(base: Settings, backlog: bool = False, whole: str = "requests") -> Settings:
    """`base` with new uuid-named topics (created) and Redis keys: each round starts empty.

    `backlog`: topic `whole` (a `Topics` attribute: the requests topic by default) keeps a whole run's backlog
    (1 GiB a partition). The embedded noida bounds every topic to 1 MiB a partition: a loop reading a pre-filled
    backlog would find its oldest records gone and wait for them for ever."""
    tag = uuid.uuid4().hex[:6]
    s = base.updated(topic_prefix=f"b{tag}.", redis_prefix=f"b{tag}:")
    if backlog:
        name = getattr(topics_of(s), whole)
        spec = next(sp for sp in specs_of(s) if sp.name == name)
        config = {**spec.config, "retention.bytes": str(1 << 30), "segment.bytes": str(16 << 20)}
        admin = make_admin(s)  # held until the futures resolve: a dropped client fails them (_DESTROY)
        for fut in admin.create_topics([NewTopic(spec.name, spec.partitions, spec.replication_factor,
                                                 config=config)]).values():
            fut.result()
    create_topics(s)
    return s


def drop_topics(s: Settings) -> None:
    """Delete a round's topics: noida re-serialises all it keeps on every write, so rounds left behind would slow
    down every later one."""
    delete_topics(s, topics_of(s).all(), timeout=30)



# --------------------------------------------------------------------------- timing answers
def run_ids(n: int, tag: str | None = None) -> list[str]:
    """n request ids unique to one run (`tag-0` .. `tag-(n-1)`, tag random unless given)."""
    tag = tag or uuid.uuid4().hex[:8]
    return [f"{tag}-{i}" for i in range(n)]


class AnswerLog:
    """The first read time (epoch s) of each id a run expects; ids of other runs never count.

    A topic reused across runs still holds the earlier runs' answers: counting them made a wait for
    "n answers" end as soon as sending did and dropped the run's own slowest answers.
    """

    def __init__(self, expected: Iterable[str]) -> None:
        self.expected = frozenset(expected)
        self.read_at: dict[str, float] = {}
        self.foreign = 0  # records read that belong to no expected id (earlier runs, other traffic)

    def note(self, rid: str, at: float) -> None:
        """Record that `rid`'s answer was read at `at` (epoch s); the first read counts."""
        if rid in self.expected:
            self.read_at.setdefault(rid, at)
        else:
            self.foreign += 1

    @property
    def complete(self) -> bool:
        return len(self.read_at) >= len(self.expected)

    def missing(self) -> list[str]:
        return sorted(self.expected - self.read_at.keys())


@dataclass
class Run:
    """One measured run: what was sent, what was answered, and every answered request's latency."""

    sent: int
    answered: int
    seconds: float  # from the run's start to the last answer read
    latencies_ms: list[float]  # one per answered request: none left out
    missing_floor_ms: float = 0.0  # every missing answer's latency is above this (it was not read in time)

    @property
    def missing(self) -> int:
        return self.sent - self.answered

    @property
    def rate(self) -> float:
        return self.answered / self.seconds if self.seconds else 0.0

    def percentiles(self, qs: Iterable[int] = (50, 95, 99)) -> list[float | None]:
        """Latency percentiles (ms, inclusive method) over every sent request, answered or not.

        A missing answer counts as slower than every answer read; a percentile that falls among the
        missing ones is not known and is None (see `missing_floor_ms` for a lower bound).
        """
        return tail_percentiles(self.latencies_ms, self.missing, qs)

    def cells(self, qs: Iterable[int] = (50, 95, 99)) -> list[str]:
        """The percentiles as table cells: `> floor` where a percentile falls among missing answers."""
        floor = max([self.missing_floor_ms, *self.latencies_ms])
        return [f"> {floor:.0f}" if v is None else f"{v:.1f}" for v in self.percentiles(qs)]


def tail_percentiles(latencies: list[float], missing: int, qs: Iterable[int] = (50, 95, 99)) -> list[float | None]:
    """Percentiles `qs` of `latencies` plus `missing` values known only to be above all of them.

    Without missing values this is `statistics.quantiles(latencies, n=100, method="inclusive")`; with
    them, a percentile whose rank needs a missing value is None rather than a number that leaves them out.
    """
    xs = sorted(latencies)
    total = len(xs) + missing
    out: list[float | None] = []
    for q in qs:
        if total == 0:
            out.append(0.0)
            continue
        pos = (total - 1) * q / 100.0  # the inclusive method's rank, 0-based
        lo, frac = int(pos), pos - int(pos)
        hi = lo + 1 if frac > 1e-12 else lo
        if hi >= len(xs):
            out.append(None)
        elif total == 1:
            out.append(xs[0])
        else:
            out.append(xs[lo] + (xs[hi] - xs[lo]) * frac)
    return out


def summarize(sent_at: dict[str, float], log: AnswerLog, t0: float, gave_up_at: float) -> Run:
    """The run from send times, read times, its start `t0` and when the wait ended (all epoch s)."""
    done = {k: log.read_at[k] for k in sent_at if k in log.read_at}
    lat = [(done[k] - t) * 1000 for k, t in sent_at.items() if k in done]
    gone = [gave_up_at - t for k, t in sent_at.items() if k not in done]
    floor = min(gone) * 1000 if gone else 0.0
    return Run(len(sent_at), len(done), (max(done.values()) - t0) if done else 0.0, lat, max(floor, 0.0))


def missing_note(runs: dict[str, Run]) -> str:
    """A sentence naming the runs whose answers did not all arrive in time ("" when all did)."""
    short = [f"{name}: {r.missing:,} of {r.sent:,} missing" for name, r in runs.items() if r.missing]
    if not short:
        return ""
    return ("**Not every answer arrived before the wait ended** (" + "; ".join(short) + "). A missing answer "
            "counts as slower than every answer read; a percentile that falls among them shows `> x`, x being "
            "a lower bound in ms.")


class AnswerReader:
    """Reads a topic in a thread from its end at start, timing the answers to the ids of one run."""

    def __init__(self, s: Settings, topic: str, expected: Iterable[str],
                 consumer: Consumer | None = None) -> None:
        self.c = consumer or make_consumer(s, f"bench-{uuid.uuid4().hex[:6]}", **{"fetch.wait.max.ms": 5})
        if isinstance(self.c, OrderedConsumer):  # woken by the workers' ring, as `tierflow answers` is
            self.c.listen(lambda: Bell(s, [topic]), now=True)
        self.topic = topic
        self.log = AnswerLog(expected)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout: float = 30.0) -> AnswerReader:
        """Start at the current end of every partition (records there are other runs'), then read."""
        md = self.c.list_topics(self.topic, timeout=timeout).topics[self.topic]
        parts = []
        for p in sorted(md.partitions):
            _, high = self.c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout)
            parts.append(TopicPartition(self.topic, p, high))
        self.c.assign(parts)  # explicit offsets: nothing produced after this point can be skipped
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            # poll_batch: consume(n, timeout) would wait out the timeout for n records, adding it to every latency
            for m in poll_batch(self.c, 5000, 0.05):
                self.take(m, time.time())

    def take(self, m: Message, now: float) -> None:
        """Note one record: its id is the key, or the `request_id` of the JSON value."""
        if m.error() is not None or not m.value():
            return
        key = m.key()
        rid = key.decode() if isinstance(key, bytes) else orjson.loads(m.value() or b"{}").get("request_id")
        if isinstance(rid, str):
            self.log.note(rid, now)

    def wait(self, timeout: float) -> float:
        """Until every expected id is answered or `timeout` s pass; returns when it stopped (epoch s)."""
        deadline = time.monotonic() + timeout
        while not self.log.complete and time.monotonic() < deadline:
            time.sleep(0.02)
        return time.time()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)
        self.c.close()

"""A Node.js consumer reads tierflow's output topics: kafkajs, the most used Node.js Kafka client, in its default
configuration, which has no lz4 (nor snappy, zstd) codec.

tierflow produces the topics other programs read (answers, DLQ, results) with `kafka_output_compression` ("none"
by default) and keeps lz4 for its internal topics. Before that split, kafkajs crashed on the first lz4 batch of
`tierflow.answers` ("LZ4 compression not implemented", logged, consumer stopped) and a consumer that did not
watch for the crash read nothing and exited 0. These tests run the real pipeline (echo models, child
processes, default compression settings) and read its output with `tests/clients/kafkajs/read.js`; the second
test proves the check can fail: the same reader exits non-zero on a topic written with compression.type=lz4.

Needs `node` and `npm`; `npm ci` installs the pinned kafkajs (package-lock.json) once, into
tests/clients/kafkajs/node_modules. Without node/npm, or when the registry cannot be reached, the tests skip.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka.admin import NewTopic

from pipeline.adapters.dlq import headers_dict
from pipeline.adapters.heartbeats import ready_agents
from pipeline.adapters.kafka import Tail, make_admin, make_producer, topics_of, wait_for_topics
from pipeline.adapters.tails import AnswerReader
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings
from tests.faults.harness import AGENT_ARGS, ECHO, request
from tests.integration.helpers import produce_all, wait_ready
from tests.npm import install_lock

pytestmark = pytest.mark.integration

CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "kafkajs"
READ_JS = CLIENT_DIR / "read.js"
NPM_CI_TIMEOUT_S = 300
READ_TIMEOUT_S = 90  # kafkajs' own timeout; tansu holds a JoinGroup for half the session timeout (15 s)

# Echo models everywhere; the heavy worker on CPU without asking torch for a GPU (importing torch costs it 10-25 s
# of start and 5 s of stop here). Every compression setting a child might inherit from the developer's shell is
# removed: the defaults are what is tested.
AGENT_ENV: dict[str, str | None] = {**ECHO, "TIERFLOW_HEAVY_DEVICE": "cpu", "TIERFLOW_KAFKA_OUTPUT_COMPRESSION": None,
                                    "TIERFLOW_KAFKA_COMPRESSION": None}

N_LIGHT, N_HEAVY = 40, 5
INVALID: dict[str, bytes] = {  # record key -> value: each goes to the DLQ
    "bad-0": b"not json at all",
    "bad-1": b'{"id": "half", "text": ',
    "bad-2": b"\xff\xfe\x00garbage",
    "bad-3": b"[1, 2, 3]",
    "bad-4": b'{"text": "no id"}',
}


# --------------------------------------------------------------------------- the Node.js client
def _pinned_kafkajs() -> str:
    return str(json.loads((CLIENT_DIR / "package.json").read_text())["dependencies"]["kafkajs"])


def _installed_kafkajs() -> str | None:
    try:
        return str(json.loads((CLIENT_DIR / "node_modules" / "kafkajs" / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class Client:
    """`node read.js`, with the pinned kafkajs installed."""

    node: str
    script: Path


@pytest.fixture(scope="session")
def kafkajs() -> Client:
    """read.js with the pinned kafkajs installed next to it (`npm ci`, once; kept between runs)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"kafkajs client test needs Node.js: {'node' if node is None else 'npm'} not on PATH")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    major = re.match(r"v?(\d+)\.", version)
    if major is None or int(major.group(1)) < 14:
        pytest.skip(f"kafkajs 2 needs Node.js >= 14, `node --version` says {version!r}")
    pinned = _pinned_kafkajs()
    with install_lock(CLIENT_DIR):
        if _installed_kafkajs() != pinned:
            try:
                out = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENT_DIR, capture_output=True,
                                     text=True, timeout=NPM_CI_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.skip(f"`npm ci` in {CLIENT_DIR} took over {NPM_CI_TIMEOUT_S} s (npm registry unreachable?)")
            if out.returncode != 0:
                lines = [ln.removeprefix("npm error").strip() for ln in (out.stderr or out.stdout).splitlines()]
                said = [ln for ln in lines if ln.startswith(("code ", "FetchError", "network", "E")) or "reason" in ln]
                pytest.skip(f"`npm ci` failed in {CLIENT_DIR} (npm registry unreachable?): "
                            + " | ".join((said or [ln for ln in lines if ln])[:3]))
            if _installed_kafkajs() != pinned:
                pytest.fail(f"`npm ci` installed kafkajs {_installed_kafkajs()}, package.json pins {pinned}")
    return Client(node, READ_JS)


@dataclass
class KafkajsRead:
    """What read.js reported: its exit status and its one JSON line."""

    topic: str
    returncode: int
    report: dict[str, Any]
    stderr: str

    @property
    def records(self) -> list[dict[str, Any]]:
        return list(self.report.get("records", []))

    def why(self) -> str:
        return (f"read.js on {self.topic}: exit {self.returncode}, read {self.report.get('count')}, "
                f"error {self.report.get('error')!r}; stderr tail:\n{self.stderr[-2000:]}")


def read_with_kafkajs(client: Client, settings: Settings, topics: Sequence[tuple[str, int]],
                      timeout_s: float = READ_TIMEOUT_S) -> dict[str, KafkajsRead]:
    """`node read.js` on each (topic, count), all at once (each joins a fresh group: on tansu a join takes 15 s)."""
    procs = {topic: subprocess.Popen([client.node, str(client.script), "--brokers", settings.kafka.servers,
                                      "--topic", topic, "--count", str(count),
                                      "--timeout-ms", str(int(timeout_s * 1000))],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for topic, count in topics}
    out: dict[str, KafkajsRead] = {}
    try:
        for topic, p in procs.items():
            stdout, stderr = p.communicate(timeout=timeout_s + 30)
            lines = [ln for ln in stdout.splitlines() if ln.strip()]
            try:
                report = json.loads(lines[-1]) if lines else {}
            except ValueError:
                report = {"error": f"not JSON: {lines[-1][:200]}"}
            out[topic] = KafkajsRead(topic, p.returncode, report, stderr)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return out


# --------------------------------------------------------------------------- the pipeline
@pytest.fixture
def agents(settings_factory: Callable[..., Settings], tmp_path: Path) -> Iterator[tuple[Settings, Stack]]:
    """Ingest and the light and heavy workers as child processes, echo models, default compression settings.

    The workers start first: an ingest that finds no heavy worker sends heavy-bound traffic to light until the
    heavy tier has been healthy for a while (hysteresis), and these requests are meant to reach both tiers.
    """
    s = settings_factory(data_dir=tmp_path)
    stack = Stack(s)
    try:
        for name in ("worker-light", "worker-heavy"):
            stack.start_agent(name, *AGENT_ARGS[name], env=AGENT_ENV)
        wait_ready(s, ["light", "heavy"], timeout=120)
        stack.start_agent("ingest", *AGENT_ARGS["ingest"], env=AGENT_ENV)
        # Ingest joined too: requests waiting through its start would look like a slow heavy tier to it.
        r = redis.Redis.from_url(s.redis.address)
        deadline = time.monotonic() + 60
        while "ingest" not in ready_agents(r, s.redis.prefix):
            if stack.dead() or time.monotonic() > deadline:
                pytest.fail(f"ingest not ready:\n{_logs(stack)}")
            time.sleep(0.1)
        yield s, stack
    finally:
        stack.stop()


def _logs(stack: Stack) -> str:
    return "\n".join(f"--- {p.name}\n{stack.tail(p.name, 15)}" for p in stack.procs)


def test_kafkajs_reads_every_answer_and_dead_letter(kafkajs: Client, agents: tuple[Settings, Stack]) -> None:
    """50 requests through the real pipeline; kafkajs (no codecs) reads every answer, dead letter and result."""
    s, stack = agents
    t = topics_of(s)
    defaults = Settings.flat_fields()
    assert defaults["kafka_output_compression"].default == "none" and defaults["kafka_compression"].default == "lz4"

    valid = {f"kjs-{i}": ("heavy" if i % 9 == 4 else "light") for i in range(N_LIGHT + N_HEAVY)}
    assert sum(k == "heavy" for k in valid.values()) == N_HEAVY
    answers_r = AnswerReader(s, from_beginning=True, dedupe=False)
    dlq_r, results_r = Tail(s, t.dlq, "beginning"), Tail(s, t.results, "beginning")
    # The requests topic is internal: the test's producer uses kafka_compression (lz4) like tierflow's own.
    produce_all(s, t.requests, [request(rid, kind) for rid, kind in valid.items()] + list(INVALID.values()),
                keys=[*valid, *INVALID])

    # tierflow's own readers (librdkafka) first: everything is there before kafkajs is asked.
    answers: list[dict[str, Any]] = []
    dead: dict[str, tuple[bytes, dict[str, str]]] = {}
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            answers += answers_r.poll(0.2)
            for m in dlq_r.poll(0.05):
                dead[(m.key() or b"").decode()] = (m.value() or b"", headers_dict(m))
            results += [orjson.loads(m.value() or b"{}") for m in results_r.poll(0.05)]
            final = {r["request_id"] for r in results if r.get("final")}
            if {str(a["request_id"]) for a in answers} >= set(valid) and set(dead) >= set(INVALID) \
                    and final >= set(valid):
                break
        time.sleep(1.0)  # a late duplicate would be counted too: kafkajs must read as many records
        answers += answers_r.poll(0.2)
        results += [orjson.loads(m.value() or b"{}") for m in results_r.poll(0.2)]
    finally:
        answers_r.close()
        dlq_r.close()
        results_r.close()
    answered = {str(a["request_id"]) for a in answers}
    assert answered == set(valid), f"tierflow's reader: {len(answered)} of {len(valid)} answered\n{_logs(stack)}"
    assert set(dead) == set(INVALID), f"tierflow's reader: dead letters {sorted(dead)}\n{_logs(stack)}"
    routes = Counter((a["tier"], a["route_reason"], a["degraded"]) for a in answers)
    assert {a["tier"] for a in answers} == {"light", "heavy"}, f"{routes}\n{_logs(stack)}"

    t0 = time.monotonic()
    reads = read_with_kafkajs(kafkajs, s, [(t.answers, len(answers)), (t.dlq, len(dead)), (t.results, len(results))])
    took = time.monotonic() - t0
    for r in reads.values():
        assert r.returncode == 0 and r.report.get("complete"), r.why()
        assert not r.report.get("error"), r.why()

    got = reads[t.answers]
    assert got.report["count"] == len(answers), got.why()
    assert set(got.report["ids"]) == set(valid), got.why()
    by_id = {str(a["request_id"]): a for a in answers}
    for rec in got.records:  # the same JSON, field for field, as tierflow's own reader decoded
        assert rec["value"] == by_id[rec["value"]["request_id"]], rec

    got = reads[t.dlq]
    assert got.report["count"] == len(INVALID), got.why()
    assert set(got.report["keys"]) == set(INVALID), got.why()
    for rec in got.records:  # the original bytes, unchanged, with the reason in headers
        assert base64.b64decode(rec["raw"]) == INVALID[rec["key"]], rec
        assert rec["headers"]["x-error-kind"] == dead[rec["key"]][1]["x-error-kind"], rec
        assert rec["headers"]["x-source-topic"] == t.requests, rec

    got = reads[t.results]
    assert got.report["count"] == len(results), got.why()
    assert set(got.report["ids"]) == set(valid), got.why()
    print(f"kafkajs read {len(answers)} answers, {len(dead)} dead letters, {len(results)} results "
          f"in {took:.1f} s (three readers in parallel)")


# --------------------------------------------------------------------------- the check can fail
# compression.type -> None where kafkajs reads it by default, else the error it crashes with.
KAFKAJS_CODECS: dict[str, str | None] = {"none": None, "gzip": None, "lz4": "LZ4 compression not implemented",
                                         "snappy": "Snappy compression not implemented",
                                         "zstd": "ZSTD compression not implemented"}


def test_kafkajs_crashes_on_lz4_batches_so_the_default_matters(kafkajs: Client,
                                                               settings_factory: Callable[..., Settings]) -> None:
    """The reader fails loudly (exit non-zero, nothing read) on a topic written with compression.type=lz4, the
    internal topics' codec, as on snappy and zstd; it reads the same records written uncompressed (the output
    default) or with gzip."""
    s = settings_factory()
    n = 10
    names = {codec: f"{s.topic.prefix}kafkajs-{codec}" for codec in KAFKAJS_CODECS}
    admin = make_admin(s)
    for fut in admin.create_topics([NewTopic(name, 1, 1) for name in names.values()], operation_timeout=30).values():
        fut.result()
    wait_for_topics(admin, list(names.values()), 30)
    for codec, topic in names.items():
        conf: dict[str, Any] = {"compression.type": codec}
        p = make_producer(s, **conf)
        for i in range(n):
            p.produce(topic, orjson.dumps({"request_id": f"{codec}-{i}", "answer": "x" * 200}), key=f"{codec}-{i}")
        assert p.flush(30) == 0

    reads = read_with_kafkajs(kafkajs, s, [(topic, n) for topic in names.values()], timeout_s=60)
    for codec, crash in KAFKAJS_CODECS.items():
        r = reads[names[codec]]
        if crash is None:
            assert r.returncode == 0 and r.report["count"] == n, r.why()
            assert set(r.report["ids"]) == {f"{codec}-{i}" for i in range(n)}, r.why()
        else:
            assert r.returncode == 1 and r.report["count"] == 0, r.why()
            assert crash in (r.report["error"] or ""), r.why()

"""Observability of a real multi-process pipeline: metrics that add up, `tierflow status`, `tierflow report`.

Ingest and one worker per tier run as child processes (`python -m pipeline.cli ...`), each serving
/metrics on its own port, all tiers on the echo backend so the test measures the pipeline, not models.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from pipeline.adapters.heartbeats import read_heartbeats
from pipeline.adapters.kafka import create_topics, topics_of
from pipeline.contracts.topics import Tier
from pipeline.ops.devstack import Stack
from pipeline.ops.samples import render_png
from pipeline.settings import Settings
from tests.conftest import free_port
from tests.integration.helpers import produce_all

pytestmark = pytest.mark.integration

TIERS = [t.value for t in Tier]
AGENTS: dict[str, tuple[str, ...]] = {
    "ingest": ("ingest",),
    **{f"worker-{t}": ("worker", "--tier", t) for t in TIERS},
}
ECHO = {"TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_HEAVY_MODEL": "echo", "TIERFLOW_MULTIMODAL_MODEL": "echo",
        "TIERFLOW_ZH_MODEL": ""}
PNG = base64.b64encode(render_png("CARD DECLINED", (160, 60))).decode()
N_VALID, N_IMAGES = 500, 10
MALFORMED: list[bytes | None] = [
    b"not json at all",
    b"\xff\xfe\x00garbage",
    b"[1, 2, 3]",
    b'{"text": "no id"}',
    orjson.dumps({"id": "big", "text": "y" * 32_769}),
    b'{"id": "t", "text": 42}',
    b'{"id": "u", "text": "hi", "unknown": true}',
    orjson.dumps({"id": "b64", "text": "hi", "image": {"data": "@@not-base64@@", "mime": "image/png"}}),
    orjson.dumps({"id": "mime", "image": {"data": PNG, "mime": "image/gif"}}),
    None,
]
SHORT = ["card not arrived", "change my PIN", "exchange rate?", "我的卡还没到", "refund please"]
LONG = ["I was charged twice for the same purchase at the supermarket yesterday, please refund one of them",
        "为什么我的转账还没有到账？已经三天了，请帮我查一下是怎么回事，谢谢。我真的很着急，需要这笔钱。"]

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --------------------------------------------------------------------------- helpers
def requests(n: int, tag: str) -> list[dict[str, object]]:
    """Short (light) and long (heavy) texts, English and Chinese, every 50th with a small PNG."""
    out: list[dict[str, object]] = []
    for i in range(n):
        # One customer per request: a customer's repeated message would be read in its conversation (a restated
        # question escalates, tests/integration/test_conversations.py), and these tests count one answer per route.
        req: dict[str, object] = {"id": f"{tag}-{i}", "user_id": f"u{tag}-{i}",
                                  "text": LONG[i % len(LONG)] if i % 3 == 0 else SHORT[i % len(SHORT)]}
        if i % 50 == 25:
            req["image"] = {"data": PNG, "mime": "image/png"}
        out.append(req)
    return out


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(sample: Scrape, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in sample.items() if n == name and want <= lab)


@dataclass
class Pipeline:
    settings: Settings
    stack: Stack
    ports: dict[str, int]
    env: dict[str, str]
    scrapes: list[dict[str, Scrape]] = field(default_factory=list)

    def scrape_all(self) -> dict[str, Scrape]:
        # Workers before ingest: an answer can only follow its request's count, never precede it.
        return {name: scrape(self.ports[name]) for name in [*AGENTS][::-1]}

    def counts(self, snap: dict[str, Scrape] | None = None) -> tuple[float, float, float]:
        """(requests in, answers, dead letters) over all processes."""
        snap = snap or self.scrape_all()
        requests_in = total(snap["ingest"], "tierflow_requests_total")
        answers = sum(total(s, "tierflow_answers_total") for s in snap.values())
        dead = sum(total(s, "tierflow_dlq_total") for s in snap.values())
        return requests_in, answers, dead

    def drained(self, timeout: float) -> dict[str, Scrape]:
        """Scrape until every request is answered or dead-lettered (and stays so) or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.scrape_all()
            self.scrapes.append(snap)
            requests_in, answers, dead = self.counts(snap)
            if requests_in > 0 and requests_in == answers + dead:
                return snap
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{self.stack.tail(n, 15)}" for n in AGENTS)
                raise AssertionError(f"not drained: in={requests_in} answers={answers} dlq={dead}\n{logs}")
            time.sleep(0.2)

    def cli(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env or self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)


def child_env(settings: Settings, metrics_port: int | None = None) -> dict[str, str]:
    env = settings.with_env()
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # one registry per process: the test sums them itself
    env.update(ECHO, TIERFLOW_LOG_JSON="true")
    if metrics_port is not None:
        env["TIERFLOW_METRICS_PORT"] = str(metrics_port)
    return env


def wait_ready(p: Pipeline, timeout: float = 60.0) -> None:
    """Every agent serves /metrics, every tier has a live worker heartbeat, ingest deems heavy healthy."""
    r = redis.Redis.from_url(p.settings.redis.address)
    deadline = time.monotonic() + timeout
    missing: list[str] = list(AGENTS)
    while missing and time.monotonic() < deadline:
        dead = [proc.name for proc in p.stack.dead()]
        assert not dead, f"{dead} exited:\n" + "\n".join(p.stack.tail(n, 30) for n in dead)
        missing = []
        for name, port in p.ports.items():
            try:
                sample = scrape(port)
            except OSError:
                missing.append(name)
                continue
            # ingest degrades heavy-bound traffic until it has seen heavy heartbeats calm for a while
            if name == "ingest" and total(sample, "tierflow_heavy_healthy") != 1:
                missing.append("ingest:heavy_healthy")
        missing += [f"ready:{t}" for t in TIERS
                    if not any(b["ready"] for b in read_heartbeats(r, p.settings.redis.prefix, t))]
        time.sleep(0.2)
    assert not missing, f"not ready after {timeout:.0f}s: {missing}"


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def pipeline(services: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tag = uuid.uuid4().hex[:8]
    s = services.updated(topic_prefix=f"t{tag}.", redis_prefix=f"t{tag}:",
                         data_dir=tmp_path_factory.mktemp("observability"))
    create_topics(s)
    stack = Stack(s)
    p = Pipeline(s, stack, {name: free_port() for name in AGENTS}, child_env(s))
    try:
        for name, args in AGENTS.items():
            stack.spawn(name, [sys.executable, "-m", "pipeline.cli", *args], env=child_env(s, p.ports[name]))
        wait_ready(p)
        yield p
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def traffic(pipeline: Pipeline) -> dict[str, Scrape]:
    """500 valid and 10 malformed requests through the pipeline; the final scrape once all are done."""
    t = topics_of(pipeline.settings)
    before = pipeline.scrape_all()
    pipeline.scrapes.append(before)
    records = [orjson.dumps(r) for r in requests(N_VALID, "obs")] + MALFORMED

    def send() -> None:  # in chunks over about a second, so there is a run to watch
        for i in range(0, len(records), 50):
            produce_all(pipeline.settings, t.requests, records[i:i + 50])
            time.sleep(0.1)

    sender = threading.Thread(target=send)
    sender.start()
    while sender.is_alive():  # scrapes while the run is in progress
        pipeline.scrapes.append(pipeline.scrape_all())
        time.sleep(0.05)
    sender.join()
    return pipeline.drained(timeout=60)


# --------------------------------------------------------------------------- (a) metrics
def test_metrics_add_up_across_processes(pipeline: Pipeline, traffic: dict[str, Scrape]) -> None:
    requests_in, answers, dead = pipeline.counts(traffic)
    assert requests_in == N_VALID + len(MALFORMED)
    assert answers == N_VALID
    assert dead == len(MALFORMED)
    assert requests_in - answers - dead == 0  # nothing in flight after the drain
    assert total(traffic["ingest"], "tierflow_dlq_total", stage="ingest") == len(MALFORMED)

    # Counters never go backwards, and the run was watched while it was going on.
    series = [pipeline.counts(snap) for snap in pipeline.scrapes]
    for earlier, later in itertools.pairwise(series):
        assert all(a <= b for a, b in zip(earlier, later, strict=True)), (earlier, later)
    assert any(0 < s[0] + s[1] < requests_in + answers for s in series), "no scrape saw the run in progress"

    routed = {t: total(traffic["ingest"], "tierflow_routed_total", tier=t) for t in TIERS}
    assert sum(routed.values()) == N_VALID
    assert routed["multimodal"] == N_IMAGES and routed["light"] > 0 and routed["heavy"] > 0
    for t in TIERS:
        w = traffic[f"worker-{t}"]
        answered = total(w, "tierflow_answers_total", tier=t)
        assert answered == routed[t], t  # echo is always confident: no escalation, one answer per routed request
        assert total(w, "tierflow_end_to_end_seconds_count", tier=t) == answered
        assert total(w, "tierflow_end_to_end_seconds_sum", tier=t) > 0
        assert total(w, "tierflow_end_to_end_seconds_bucket", tier=t, le="+Inf") == answered
        inferred = total(w, "tierflow_inference_seconds_count", tier=t)
        assert inferred == answered
        batches = total(w, "tierflow_batch_size_count", tier=t)
        assert 0 < batches <= answered
        assert total(w, "tierflow_batch_size_sum", tier=t) == inferred  # every message is in one batch
        assert total(w, "tierflow_queue_seconds_count", tier=t) == answered
        assert total(w, "tierflow_worker_heartbeat_timestamp_seconds", tier=t) > time.time() - 30
    # micro-batching happened: 500 messages in far fewer than 500 batches
    assert sum(total(traffic[f"worker-{t}"], "tierflow_batch_size_count") for t in TIERS) < N_VALID


def test_a_gauge_is_exported_only_by_the_process_that_owns_it(pipeline: Pipeline,
                                                                traffic: dict[str, Scrape]) -> None:
    """`min(tierflow_heavy_healthy)` over every process is ingest's verdict (1 on this healthy stack), not the
    other processes' default 0; `max(tierflow_heavy_share)` is the feedback agent's."""
    exporters = {name: {n for n, _ in sample} for name, sample in traffic.items()}
    assert [n for n, names in exporters.items() if "tierflow_heavy_healthy" in names] == ["ingest"]
    assert min(v for sample in traffic.values() for (n, _), v in sample.items() if n == "tierflow_heavy_healthy") == 1
    assert [n for n, names in exporters.items() if "tierflow_heavy_share" in names] in ([], ["feedback"])


def test_agents_log_json_lines(pipeline: Pipeline, traffic: dict[str, Scrape]) -> None:
    """TIERFLOW_LOG_JSON=true: the agents' own log lines are JSON objects (librdkafka's stay raw)."""
    for name in AGENTS:
        log_path = pipeline.stack.log_dir / f"{name}.log"
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("{")]
        assert lines, f"{name}: no JSON log line in {log_path}"
        for line in lines:
            rec = json.loads(line)
            assert {"ts", "level", "logger", "msg"} <= set(rec), line


# --------------------------------------------------------------------------- (b) status
def test_status_once_renders_the_running_pipeline(pipeline: Pipeline, traffic: dict[str, Scrape]) -> None:
    t = topics_of(pipeline.settings)
    stop = threading.Event()

    def trickle() -> None:  # live traffic while the frame is collected, so rates are not zero
        i = 0
        while not stop.is_set():
            produce_all(pipeline.settings, t.requests, [orjson.dumps(r) for r in requests(20, f"st{i}")])
            i += 1
            stop.wait(0.1)

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        time.sleep(1.0)
        started = time.monotonic()
        # a terminal wide enough for the wide table (models in its last column: status.NARROW)
        out = pipeline.cli("status", "--once", env={**pipeline.env, "COLUMNS": "160"}, timeout=30)
        took = time.monotonic() - started
    finally:
        stop.set()
        sender.join(10)
    assert out.returncode == 0, out.stderr
    frame = out.stdout
    cells = [line.replace("│", " ").split() for line in frame.splitlines()]
    rows = {c[0]: c for c in cells if len(c) > 2 and c[0] in [*TIERS, "all"] and c[1].isdigit()}
    assert set(rows) == {*TIERS, "all"}, frame
    for tier in TIERS:
        workers, rate, p95 = rows[tier][1], rows[tier][2], rows[tier][3]
        assert workers == "1", frame
        assert re.fullmatch(r"\d+\.\d", rate) and re.fullmatch(r"\d+|-", p95), frame
    assert float(rows["light"][2]) > 0 and float(rows["heavy"][2]) > 0, frame
    assert rows["light"][-1].startswith("echo@"), frame
    assert "heavy share" in frame and "(budget 25%)" in frame, frame
    assert re.search(r"thresholds v\d+", frame) and "length_threshold=50" in frame, frame
    assert "last dead letters" in frame and re.search(r"(schema|encoding|not_json) +ingest", frame), frame
    assert took < 20
    # an 80x24 terminal: the narrow layout, no value cut to "…"
    narrow = pipeline.cli("status", "--once", env=dict(pipeline.env, COLUMNS="80"), timeout=30)
    assert narrow.returncode == 0, narrow.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 80 and "…" not in narrow.stdout, narrow.stdout
    assert all(t in narrow.stdout for t in TIERS) and "echo@" in narrow.stdout, narrow.stdout
    pipeline.drained(timeout=30)


def _rdkafka_started(pid: int) -> bool:
    """Whether the process runs a librdkafka client yet (its threads are named rdk:...)."""
    with contextlib.suppress(OSError):
        return any(Path(f"/proc/{pid}/task/{t}/comm").read_text().startswith("rdk:")
                    for t in os.listdir(f"/proc/{pid}/task"))
    return False


def test_status_live_view_stops_cleanly_on_ctrl_c(pipeline: Pipeline) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "status", "--interval", "0.5"], env=pipeline.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Ctrl-C once the command runs (its Kafka clients have started), not while Python still imports it: on a
        # loaded box that takes seconds, and an interrupted import is Python's, not the command's.
        deadline = time.monotonic() + 60
        while not _rdkafka_started(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err  # Ctrl-C: 128 + SIGINT, as a shell expects
    assert "tierflow status" in out and "multimodal" in out and "Traceback" not in err


def test_status_says_when_kafka_is_unreachable(pipeline: Pipeline) -> None:
    env = dict(pipeline.env, TIERFLOW_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")
    out = pipeline.cli("status", "--once", env=env, timeout=30)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot reach Kafka" in out.stderr, out.stderr


# --------------------------------------------------------------------------- (c) report
def test_report_after_the_run(pipeline: Pipeline, traffic: dict[str, Scrape], tmp_path: Path) -> None:
    snap = pipeline.drained(timeout=30)
    # ground truth for 100 of the run's requests (schemas/label.v1.json): echo's intent is always "echo"
    labels = [{"request_id": f"obs-{i}", "intent": "echo" if i % 4 else "card_arrival"} for i in range(100)]
    produce_all(pipeline.settings, topics_of(pipeline.settings).labels, [orjson.dumps(x) for x in labels])
    out = pipeline.cli("report", "--out", str(tmp_path), timeout=60)
    assert out.returncode == 0, out.stderr
    png, txt = tmp_path / "report.png", tmp_path / "report.txt"
    assert png.stat().st_size > 20_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = txt.read_text()
    assert text in out.stdout
    _, answers, dead = pipeline.counts(snap)
    assert re.search(rf"^answers {int(answers)} ", text, re.M), text
    for tier in TIERS:  # the report's counts, read back from the results topic, match the workers' counters
        n = int(total(snap[f"worker-{tier}"], "tierflow_answers_total", tier=tier))
        assert re.search(rf"^{tier}\s+{n}\s", text, re.M), (tier, n, text)
    assert f"dead letters {int(dead)} (" in text and "not_json" in text, text
    assert re.search(r"^all .* 75\.0% \(n=100\)$", text, re.M), text
    assert "heavy share" in text and "(budget 25.0%)" in text

    # The last N minutes: by record timestamp, so a window before the run holds nothing.
    recent = pipeline.cli("report", "--out", str(tmp_path / "none"), "--minutes", "0.0001", timeout=60)
    assert recent.returncode == 0, recent.stderr
    assert "no answers" in recent.stdout
    assert os.path.getsize(tmp_path / "none" / "report.png") > 10_000


# --------------------------------------------------------------------------- (d) the front door
def test_send_wait_prints_the_answer_and_answers_lists_it(pipeline: Pipeline) -> None:
    """What a person types, each a new process: `send TEXT --wait` prints that request's answer, `answers` then lists
    it (after the report: this request is not part of the run the report checks)."""
    rid = f"front-{uuid.uuid4().hex[:8]}"
    sent = pipeline.cli("send", "where is my order?", "--id", rid, "--wait", "--timeout", "30")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith(f"sent {rid}\n"), sent.stdout
    assert json.loads(sent.stdout[sent.stdout.index("{"):])["request_id"] == rid, sent.stdout
    listed = pipeline.cli("answers", "--json")
    assert listed.returncode == 0, listed.stderr
    assert rid in {json.loads(line)["request_id"] for line in listed.stdout.splitlines() if line.startswith("{")}

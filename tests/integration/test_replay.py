"""Replay and backfill under live traffic: one replay-marked answer per id, live latency held, idempotent,
resumable, and labelled files feed accuracy."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer

from pipeline.adapters.brokers import EmbeddedBroker
from pipeline.adapters.dlq import headers_dict
from pipeline.adapters.kafka import topics_of
from pipeline.contracts.keys import Keys
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings
from tests.integration.helpers import TEXTS, Live, drain, produce_all, reader, values, wait_ready

pytestmark = pytest.mark.integration

ECHO = {"TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_HEAVY_MODEL": "echo", "TIERFLOW_MULTIMODAL_MODEL": "echo",
        "TIERFLOW_ZH_MODEL": ""}


@contextmanager
def echo_pipeline(s: Settings) -> Iterator[Stack]:
    """Ingest and one echo worker per tier as real child processes (their own GILs, as in production)."""
    stack = Stack(s)
    stack.start_agent("ingest", "ingest", env=ECHO)
    for tier in ("light", "heavy", "multimodal"):
        stack.start_agent(f"worker-{tier}", "worker", "--tier", tier, env=ECHO)
    try:
        wait_ready(s, ["light", "heavy", "multimodal"], timeout=120)
        time.sleep(2.0)
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def echo_processes(settings_factory: Callable[..., Settings]) -> Iterator[Settings]:
    s = settings_factory()
    with echo_pipeline(s):
        yield s


def cli(s: Settings, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **s.with_env()}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, **{"check": True, **kw})


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1]


LIVE_RATE = 500  # msg/s
LEAD_S = 3.0  # live traffic before the replay starts (in production it is always there): the guard's baseline
# The answers are read from the start of the topic once the replay is done: ~40,000 of them, ~5 MiB a partition,
# more than the embedded noida keeps by default (1 MiB a partition).
KEEP = {"topic_retention_bytes": 64 * 1024 * 1024}


def live_latency(s: Settings, live: Live, n_other: int) -> dict[str, float]:
    """Total latency (ms) per live request id, from the answers topic (`n_other`: the replayed answers in it)."""
    answers = reader(s, topics_of(s).answers)
    got = values(drain(answers, lambda ms: len(ms) >= n_other + len(live.sent), timeout=180, settle=2.0))
    answers.close()
    return {a["request_id"]: a["timings_ms"]["total"] for a in got if not a["replay"]}


@pytest.mark.parametrize(("guarded", "strict"), [
    (True, False),
    # The live-p95 bound asserted: on the embedded broker live latency drifts by itself (tansu's log growth, see
    # below) by as much as the bound within one replay, so this passes in some runs only (issue 7's notes).
    pytest.param(True, True, marks=pytest.mark.slow),
    # Without the live-latency guard: prints the comparison, for what the guard buys.
    pytest.param(False, False, marks=pytest.mark.slow),
])
def test_replay_time_range_beside_live_traffic(settings_factory: Callable[..., Settings], guarded: bool,
                                               strict: bool, broker: EmbeddedBroker | None) -> None:
    """10,000 recorded requests replayed beside 500 msg/s of live traffic: one replay-marked answer each, live
    p95 within 20% of live p95 without a replay (`strict`), and a second replay of the range answers nothing again.

    The latency comparison runs in the slow variants only. The default one replays 3,000 and checks the replay's
    answers: the guard holds a replay back while live latency is up, and beside the suite's other tests on 2 cores
    10,000 took it 5-8 minutes (the same properties, and the guard's pacing, at a third of the count).
    The two p95s are measured A/B: the same live traffic, over the same span of pipeline age, on two
    fresh pipelines of which one replays. On the embedded broker live latency creeps up the longer
    traffic flows, replay or not (tansu's in-memory log makes a fetch cost time in proportion to the
    record batches its partition holds; BENCHMARKS.md, "End-to-end pipeline"), so a no-replay window
    taken before the replay would charge that creep to the replay.
    """
    if broker is not None and broker.name == "tansu":
        pytest.skip("tansu: its log slows down as it grows (BENCHMARKS.md, 'Sustained load on tansu': bare p99 "
                    "254 ms, then 1.5 s at 1,000 msg/s); this test's 50,000 records, after the rest of the "
                    "suite on one broker, failed there, though it passes on a fresh tansu (349 s)")
    n = 3_000 if guarded and not strict else 10_000
    # The recording: n requests answered once by a pipeline, then 100 more after the range.
    s1 = settings_factory(**KEEP)
    t1 = topics_of(s1)
    with echo_pipeline(s1):
        answers = reader(s1, t1.answers)
        start_ms = int(time.time() * 1000) - 1
        produce_all(s1, t1.requests, [orjson.dumps({"id": f"rec-{i}", "text": TEXTS[i % 4]}) for i in range(n)])
        end_ms = int(time.time() * 1000) + 1
        time.sleep(1.5)
        produce_all(s1, t1.requests, [orjson.dumps({"id": f"late-{i}", "text": TEXTS[0]}) for i in range(100)])
        drain(answers, lambda ms: len(ms) >= n + 100, timeout=120)
        answers.close()

    # B: a fresh pipeline, live traffic, and a replay of the recorded range.
    s2 = settings_factory(**KEEP)
    t2 = topics_of(s2)
    r = redis.Redis.from_url(s2.redis.address)
    replay = ["replay", "--topic", t1.requests, "--from", str(start_ms), "--to", str(end_ms)]
    with echo_pipeline(s2):
        with Live(s2, "during", LIVE_RATE) as during:
            time.sleep(LEAD_S)
            first, t0 = len(during.sent), time.monotonic()
            out = cli(s2, *replay, "--rate", "2500", *([] if guarded else ["--max-live-slowdown", "0"]))
            # The replay lasts until its last request is answered (workers note each in Redis first).
            deadline = time.monotonic() + 120
            while r.scard(Keys(s2.redis.prefix).replay_answered) < n and time.monotonic() < deadline:
                time.sleep(0.1)
            took = time.monotonic() - t0
            time.sleep(1)
            last = len(during.sent)
        print(f"\nreplay of {n:,} answered in {took:.1f}s: {out.stdout.strip()}\n{out.stderr[-3000:]}")
        assert f"sent {n}" in out.stdout, out.stdout + out.stderr

        answers = reader(s2, t2.answers)
        got = values(drain(answers, lambda ms: sum(1 for v in values(ms) if v["replay"]) >= n
                           and len(ms) >= n + len(during.sent), timeout=180, settle=2.0))
        replayed = Counter(a["request_id"] for a in got if a["replay"])
        assert set(replayed) == {f"rec-{i}" for i in range(n)}  # the range, nothing from after it
        assert max(replayed.values()) == 1

        # The same range again: the job is complete; a restarted job skips every answered id.
        again = cli(s2, *replay)
        assert "sent 0" in again.stdout
        forced = cli(s2, *replay, "--restart")
        assert f"sent 0, skipped {n}" in forced.stdout
        time.sleep(3)
        extra = [a for a in values(drain(answers, lambda ms: False, timeout=3)) if a["replay"]]
        assert extra == []
        answers.close()
    answered = {a["request_id"] for a in got}  # once: tens of thousands of live ids are looked up in it
    assert all(i in answered for i in during.sent)  # live answers went on meanwhile
    if guarded and not strict:
        return  # the default variant: no latency comparison asked of it
    lat_during = {a["request_id"]: a["timings_ms"]["total"] for a in got if not a["replay"]}

    # A: another fresh pipeline, the same live traffic for as long, no replay.
    s3 = settings_factory(**KEEP)
    with echo_pipeline(s3):
        with Live(s3, "base", LIVE_RATE) as base:
            time.sleep(last / LIVE_RATE + 0.5)
        lat_base = live_latency(s3, base, 0)

    assert all(i in lat_base for i in base.sent)
    # The same span of live traffic in both: from the replay's start to a second after its last answer.
    p95_base = p95([lat_base[i] for i in base.sent[first:last]])
    p95_during = p95([lat_during[i] for i in during.sent[first:last]])
    print(f"live p95 without replay {p95_base:.1f} ms, during replay {p95_during:.1f} ms "
          f"({p95_during / p95_base - 1:+.0%}; replay of {n:,} took {took:.1f}s, guard {guarded})")
    if strict:
        assert p95_during <= 1.2 * p95_base, (p95_base, p95_during)


def interrupted_replay(s: Settings, path: Path, tag: str, n: int) -> tuple[Consumer, list[dict[str, Any]]]:
    """`tierflow replay --file` of `n` requests at 600/s, killed once a few hundred are answered (it first waits
    up to 3 s for live traffic to measure); the answers reader and the replay answers seen so far."""
    path.write_text("".join(orjson.dumps({"id": f"{tag}-{i}", "text": TEXTS[i % 4]}).decode() + "\n"
                            for i in range(n)))
    answers = reader(s, topics_of(s).answers)
    env = {**os.environ, **s.with_env()}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "replay", "--file", str(path), "--rate", "600"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = [a for a in values(drain(answers, lambda ms: len(ms) >= 200, timeout=60)) if a["replay"]]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first += [a for a in values(drain(answers, lambda ms: False, timeout=3)) if a["replay"]]
    assert 0 < len(first) < n
    return answers, first


def test_interrupted_replay_resumes(echo_processes: Settings, tmp_path: Path) -> None:
    s = echo_processes
    path = tmp_path / "backfill.jsonl"
    answers, first = interrupted_replay(s, path, "file", 3000)
    out = cli(s, "replay", "--file", str(path))
    assert "sent" in out.stdout
    rest = values(drain(answers, lambda ms: len(first) + len(ms) >= 3000, timeout=60, settle=2.0))
    ids = Counter(a["request_id"] for a in first + rest if a["replay"])
    assert set(ids) == {f"file-{i}" for i in range(3000)}
    assert max(ids.values()) == 1
    answers.close()


def test_labelled_file_replay_reports_accuracy_per_tier(settings_factory: Callable[..., Settings], tmp_path: Path,
                                                        packaged_models: dict[Any, Any]) -> None:
    """A JSONL file with labels: ground truth reaches tierflow.labels and `replay --wait` prints accuracy per tier."""
    import csv

    from pipeline.agents.ingest import Ingest
    from pipeline.contracts.topics import Tier
    from workers.runner import Worker

    s = settings_factory()
    # the default domain's held-out messages (Bitext's test split: the e-commerce pack's models never saw them)
    rows = list(csv.DictReader((Path(__file__).parents[2] / "workers/data/bitext/test.csv").open()))[::15]
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(orjson.dumps({"id": f"lab-{i}", "text": r["text"], "label": r["category"]}).decode()
                            + "\n" for i, r in enumerate(rows)))
    agents: list[Ingest | Worker] = [Ingest(s), *(Worker(s, t, packaged_models[t]) for t in (Tier.LIGHT, Tier.HEAVY))]
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for t in threads:
        t.start()
    try:
        wait_ready(s, ["light", "heavy"])
        labels = reader(s, topics_of(s).labels)
        out = cli(s, "replay", "--file", str(path), "--wait", "120")
        got = values(drain(labels, lambda ms: len(ms) >= len(rows), timeout=30))
        labels.close()
    finally:
        for a in agents:
            a.stop()
        for t in threads:
            t.join(30)
    assert f"sent {len(rows)}" in out.stdout and f"labels {len(rows)}" in out.stdout
    assert {g["request_id"] for g in got} == {f"lab-{i}" for i in range(len(rows))}
    table = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.split()}
    assert {"light", "heavy", "all"} <= set(table), out.stdout
    assert int(table["all"][1]) == len(rows)
    assert float(table["all"][2].rstrip("%")) > 85.0, out.stdout


def test_a_request_that_fits_its_file_but_not_the_replay_headers_is_dead_lettered(
        settings_factory: Callable[..., Settings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded request just under the record limit passes validation, but the replay topic's copy carries
    replay headers and a key: it cannot be written, so it goes to the DLQ with the reason and the job goes on."""
    monkeypatch.setenv("TIERFLOW_MAX_MESSAGE_BYTES", "65536")  # the replay process's limit, as the topics'
    s = settings_factory(max_message_bytes=65_536)
    big = orjson.dumps({"id": "big", "text": ""})  # Chinese text: under the 32,768-character limit, near 64 KiB
    big = big[:-2] + "货".encode() * ((s.max_message_bytes - 60 - len(big)) // 3) + b'"}'
    lines = [orjson.dumps({"id": "small-1", "text": TEXTS[0]}), big, orjson.dumps({"id": "small-2", "text": TEXTS[1]})]
    path = tmp_path / "near-limit.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = cli(s, "replay", "--file", str(path), "--max-live-slowdown", "0", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sent 2" in out.stdout and "invalid 1" in out.stdout, out.stdout + out.stderr
    dlq = reader(s, topics_of(s).dlq)
    dead = drain(dlq, lambda ms: len(ms) >= 1, timeout=30)
    dlq.close()
    assert len(dead) == 1
    hd = headers_dict(dead[0])
    assert hd["x-error-kind"] == "oversize" and "replay" in hd.get("x-stage", "replay"), hd
    assert "bytes" in hd["x-error"], hd


def test_replay_resumed_after_redis_lost_its_state_answers_no_id_twice(echo_processes: Settings,
                                                                       tmp_path: Path) -> None:
    """Killed mid-way, then every key of the pipeline gone from Redis (a restart without persistence, a flush),
    then resumed: the job's position and the answered ids come back from the control topic, so the resumed run
    neither starts over nor answers an id again."""
    s = echo_processes
    path = tmp_path / "backfill.jsonl"
    answers, first = interrupted_replay(s, path, "lost", 2000)
    r = redis.Redis.from_url(s.redis.address)
    lost = list(r.scan_iter(f"{s.redis.prefix}*"))
    assert any(k.endswith(b"replay:answered") for k in lost)
    r.delete(*lost)
    out = cli(s, "replay", "--file", str(path))
    skipped = int(out.stdout.split("skipped ", 1)[1].split()[0])
    assert skipped <= 60, out.stdout  # resumed where it got to: at most its last chunk (0.1 s at 600/s) again
    rest = values(drain(answers, lambda ms: len(first) + len(ms) >= 2000, timeout=60, settle=2.0))
    ids = Counter(a["request_id"] for a in first + rest if a["replay"])
    assert set(ids) == {f"lost-{i}" for i in range(2000)}
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1][:10]
    answers.close()

"""The feedback agent against a real broker and a real Redis.

Synthetic traffic is "routed" with the thresholds the agent writes (read back from Redis as the
ingest and workers would), with a light-confidence distribution that drifts lower (more escalations),
and published as schema-valid result records (plus some labels on the labels topic). The agent runs as
a child process (`python -m pipeline.agents.feedback`), as `tierflow up` runs it.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pipeline.adapters.heartbeats import fault_key, read_heartbeats, ready_agents
from pipeline.adapters.kafka import make_producer, produce, topics_of
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.contracts.keys import Keys
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings
from schemas import validator
from tests.conftest import free_port
from tests.integration.helpers import Live, drain, reader, values, wait_ready
from tests.integration.test_replay import ECHO

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# result.v1.json refers to answer.v1.json: the validator resolves tierflow's schemas by their $id
RESULT_SCHEMA = validator("result")
INTENTS = ["card_arrival", "exchange_rate", "pin_blocked", "transfer_fee_charged"]


def result(rid: str, tier: str, conf: float, final: bool, *, escalated: bool = False, intent: str = "card_arrival",
           label: str | None = None, chars: int = 30, version: int = 1, total_ms: float = 20.0) -> dict[str, Any]:
    now = int(time.time() * 1000)
    return {
        "request_id": rid, "user_id": None, "answer": "ok" if final else "", "intent": intent, "confidence": conf,
        "tier": tier, "model": "charngram" if tier == "light" else "minilm", "escalated": escalated,
        "degraded": False, "route_reason": "length" if tier == "heavy" and not escalated else "short",
        "timings_ms": {"ingest": 0.4, "queue": 1.5, "inference": 2.0, "total": total_ms},
        "replay": False, "threshold_version": version, "lang": "en", "answered_at": now, "final": final,
        "stage": tier, "shadow": False,
        "features": {"chars": chars, "tokens": chars // 5, "script": "en", "lang": "en", "has_image": False,
                     "image_bytes": 0, "vip": False, "question": True, "complaint": False, "urgent": False},
        "timestamps": {"received": now, "ingested": now, "dequeued": now, "inferred": now, "produced": now},
        "batch_size": 8, "worker_id": "test", "label": label, "light_intent": None, "light_confidence": None,
    }


class Traffic:
    """Requests routed with the live thresholds; records what share went heavy, per second."""

    def __init__(self, s: Settings, seed: int = 3) -> None:
        self.s = s
        self.topics = topics_of(s)
        self.p = make_producer(s)
        self.store = ThresholdStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
        self.rnd = random.Random(seed)
        self.n = 0
        self.records = 0
        self.heavy_by_second: dict[int, list[int]] = {}
        self.checked = False

    def send(self, rec: dict[str, Any]) -> None:
        if not self.checked:
            RESULT_SCHEMA.validate(rec)
            self.checked = True
        produce(self.p, self.topics.results, orjson.dumps(rec), rec["request_id"].encode())
        self.records += 1

    def request(self, conf_mean: float, length: int, esc: float, version: int) -> None:
        rid = f"q{self.n}-{uuid.uuid4().hex[:6]}"
        self.n += 1
        chars = max(1, int(self.rnd.lognormvariate(math.log(30), 0.5)))
        k = 6.0
        conf = self.rnd.betavariate(conf_mean * k, (1 - conf_mean) * k)
        truth = self.rnd.choice(INTENTS)
        light_guess = truth if self.rnd.random() < conf else self.rnd.choice(INTENTS)
        inline = truth if self.rnd.random() < 0.5 else None
        heavy = 1
        if chars > length:
            self.send(result(rid, "heavy", 0.9, True, intent=truth, label=inline, chars=chars, version=version,
                             total_ms=300.0))
        elif conf < esc:
            self.send(result(rid, "light", conf, False, intent=light_guess, label=inline, chars=chars,
                             version=version))
            self.send(result(rid, "heavy", 0.9, True, escalated=True, intent=truth, label=inline, chars=chars,
                             version=version, total_ms=320.0))
        else:
            heavy = 0
            self.send(result(rid, "light", conf, True, intent=light_guess, label=inline, chars=chars,
                             version=version))
        if inline is None and self.rnd.random() < 0.3:  # ground truth arriving later, on the labels topic
            produce(self.p, self.topics.labels, orjson.dumps({"request_id": rid, "intent": truth}), rid.encode())
        self.heavy_by_second.setdefault(int(time.monotonic()), []).append(heavy)

    def run(self, seconds: float, rate: float, conf_from: float, conf_to: float) -> None:
        """`rate` requests/s for `seconds`, confidence mean drifting linearly; thresholds re-read every 0.2 s."""
        t0 = time.monotonic()
        th = self.store.get()
        last_read = t0
        sent = 0
        while (elapsed := time.monotonic() - t0) < seconds:
            if time.monotonic() - last_read > 0.2:
                th, last_read = self.store.get(), time.monotonic()
            mean = conf_from + (conf_to - conf_from) * elapsed / seconds
            due = int(elapsed * rate)
            while sent < due:
                self.request(mean, th.length_threshold, th.escalate_below, th.version)
                sent += 1
            self.p.poll(0)
            time.sleep(0.01)
        assert self.p.flush(30) == 0

    def share(self, last_s: int) -> float:
        """Heavy share of the requests of the last `last_s` whole seconds."""
        secs = sorted(self.heavy_by_second)[-last_s - 1:-1]
        xs = [x for s in secs for x in self.heavy_by_second[s]]
        return sum(xs) / len(xs)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(s: Settings, **knobs: Any) -> subprocess.Popen[bytes]:
        env = s.with_env()
        env.update({f"TIERFLOW_FEEDBACK_{k.upper()}": str(v) for k, v in knobs.items()})
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["TIERFLOW_DATA_DIR"] = str(tmp_path / "data")
        log = open(tmp_path / f"feedback-{len(procs)}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen([sys.executable, "-m", "pipeline.agents.feedback"], env=env, cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def tail(tmp_path: Path, lines: int = 40) -> str:
    return "\n".join("\n".join(p.read_text(errors="replace").splitlines()[-lines:])
                     for p in sorted(tmp_path.glob("feedback-*.log")))


def snapshot(r: redis.Redis, s: Settings) -> dict[str, Any] | None:
    raw = r.get(Keys(s.redis.prefix).feedback_state)
    return orjson.loads(raw) if raw else None


def labeled(snap: dict[str, Any]) -> int:
    return int(snap["agg"]["counters"]["labeled"])


KNOBS = {"window_s": 4, "hop_s": 0.5, "interval_s": 0.5, "min_results": 100, "observe_s": 3}


def test_agent_moves_thresholds_and_survives_restart(settings_factory: Callable[..., Settings],
                                                      agent_factory: Callable[..., subprocess.Popen[bytes]],
                                                      tmp_path: Path) -> None:
    s = settings_factory()
    r = redis.Redis.from_url(s.redis.address)
    store = ThresholdStore(r, s.redis.prefix)
    store.init()
    agent = agent_factory(s, **KNOBS)
    traffic = Traffic(s)
    wait_for(lambda: snapshot(r, s), 30, "the agent's first snapshot")

    # Confidence drifts from 0.75 to 0.6: escalations would grow by half without the controller.
    traffic.run(14, rate=400, conf_from=0.75, conf_to=0.6)
    mine = [d for d in store.history() if d.updated_by == "feedback"]
    assert mine, f"no threshold change by the agent; its log:\n{tail(tmp_path)}"
    print("\n".join(f"v{d.version} {d.length_threshold} {d.escalate_below} {d.reason}" for d in mine))
    for doc in mine:
        assert {"heavy_share", "text_answers"} <= set(doc.inputs)
        if doc.reason.startswith("rollback"):
            assert doc.inputs["rollback_to"] < doc.version
        else:
            assert "heavy share" in doc.reason and "predicted_share" in doc.inputs
    now = store.get()
    assert now.version > 1 and now.escalate_below != 0.5
    assert abs(traffic.share(4) - now.heavy_budget) < 0.06, (traffic.share(4), [d.reason for d in mine])

    # A result waiting for its label when the agent stops...
    traffic.send(result("probe-1", "light", 0.9, True, intent="pin_blocked"))
    assert traffic.p.flush(10) == 0
    done = wait_for(lambda: (x := snapshot(r, s)) and x["agg"]["counters"]["observed"] >= traffic.records and x,
                    20, "every record counted")
    assert "probe-1" in dict(done["agg"]["awaiting"])
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(20) == 0
    before = snapshot(r, s)
    assert before is not None
    assert before["agg"]["counters"]["observed"] == traffic.records

    # ... is joined with its label by the restarted agent, which counted nothing twice.
    agent2 = agent_factory(s, **KNOBS)
    wait_for(lambda: (x := snapshot(r, s)) and x["saved_at"] > before["saved_at"], 30, "a snapshot by the new agent")
    produce(traffic.p, traffic.topics.labels, orjson.dumps({"request_id": "probe-1", "intent": "pin_blocked"}),
            b"probe-1")
    assert traffic.p.flush(10) == 0
    after = wait_for(lambda: (x := snapshot(r, s)) and "probe-1" not in dict(x["agg"]["awaiting"]) and x, 30,
                     "the probe's label joined")
    assert after["agg"]["counters"]["observed"] == before["agg"]["counters"]["observed"]
    assert labeled(after) == labeled(before) + 1
    pending = before["controller"]["pending"]
    watched = f"v{pending['version']}" if pending else "none"
    assert f"change under watch: {watched}" in (tmp_path / "feedback-1.log").read_text(), tail(tmp_path)
    agent2.send_signal(signal.SIGTERM)
    assert agent2.wait(20) == 0


def test_redis_outage_is_survived(settings_factory: Callable[..., Settings],
                                  agent_factory: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    # A Redis of its own, to stop and start again.
    port = free_port()
    s = settings_factory().updated(redis_url=None, redis_port=port, data_dir=tmp_path)
    own = Stack(s)
    own.start_redis()
    try:
        r = redis.Redis.from_url(s.redis.address, socket_timeout=2)
        ThresholdStore(r, s.redis.prefix).init()
        agent = agent_factory(s, **KNOBS)
        traffic = Traffic(s)
        wait_for(lambda: snapshot(r, s), 30, "the agent's first snapshot")
        traffic.run(2, rate=200, conf_from=0.7, conf_to=0.7)
        wait_for(lambda: (x := snapshot(r, s)) and x["agg"]["counters"]["observed"] == traffic.records, 20,
                 "records counted")

        own.stop()
        for i in range(300):
            traffic.send(result(f"outage-{i}", "light", 0.8, True))
        assert traffic.p.flush(10) == 0
        time.sleep(3)
        assert agent.poll() is None, "the agent died with Redis"

        own.start_redis()
        r = redis.Redis.from_url(s.redis.address, socket_timeout=2)
        back = wait_for(lambda: (x := snapshot(r, s)) and x, 30, "a snapshot after Redis came back")
        wait_for(lambda: snapshot(r, s)["agg"]["counters"]["observed"] == traffic.records, 10,  # type: ignore[index]
                 "every record, also those of the outage, counted once")
        assert back is not None
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
    finally:
        own.stop()


# Twenty texts, one per request in turn: ten short, ten heavy-bound by the length rule at 50 characters with
# lengths spread out, so a shed can move part of them (one 25% length step moves one or two texts).
_LONG = ("I want a refund for a purchase I never made, the shop charged me twice and will not answer my emails, "
         "so please look into it")
SLOW_TEXTS = [f"my card {i} has not arrived" for i in range(10)] + [
    _LONG[:n] for n in (58, 66, 72, 80, 86, 92, 98, 104, 110, 118)]
SLOWDOWN_S = 8.0
AFTER_S = 20.0  # traffic after the slowdown: the return must come well inside the 30 s


def test_heavy_slowdown_shifts_traffic_and_returns(settings_factory: Callable[..., Settings],
                                                   agent_factory: Callable[..., subprocess.Popen[bytes]],
                                                   tmp_path: Path) -> None:
    """A 10x slowdown of the heavy tier: heavy-bound traffic moves off heavy within 5 s and comes back within
    30 s of the slowdown ending; the threshold history shows the shed and the restore with their reasons."""
    s = settings_factory()
    r = redis.Redis.from_url(s.redis.address)
    store = ThresholdStore(r, s.redis.prefix)
    # the budget is what the length rule routes heavy at 50 characters: the controller holds still until the slowdown
    # The SLO sits well above the echo pipeline's noise on a loaded 2-core box (a heavy p95 of 287 ms once, with no
    # slowdown, shed traffic a second time), and the slowdown well above the SLO.
    setup = store.update("test", "SLO and budget for the echo pipeline", heavy_slo_p95_ms=400, recover_after_s=1.0,
                         heavy_budget=0.5)
    stack = Stack(s)
    try:
        stack.start_agent("ingest", "ingest", env=ECHO)
        for tier in ("light", "heavy", "multimodal"):
            stack.start_agent(f"worker-{tier}", "worker", "--tier", tier, env=ECHO)
        wait_ready(s, ["light", "heavy", "multimodal"])
        agent = agent_factory(s, **KNOBS)
        # On a loaded box the agent may join after the slowdown began (a CI run's tansu pass: ingest's health check
        # moved the traffic, the agent never saw enough of it to act): the slowdown waits for it to count traffic.
        wait_for(lambda: "feedback" in ready_agents(r, s.redis.prefix), 60, "the feedback agent ready")
        answers = reader(s, topics_of(s).answers)
        with Live(s, "slow", 100, texts=SLOW_TEXTS) as live:
            counting = time.monotonic()
            wait_for(lambda: (x := snapshot(r, s)) and x["agg"]["counters"]["observed"] >= 2 * KNOBS["min_results"],
                     60, "the agent counting the live traffic")
            time.sleep(max(0.0, 4 - (time.monotonic() - counting)))
            base_p95 = max(b["live_p95_ms"] for b in read_heartbeats(r, s.redis.prefix, "heavy"))
            inject = max(800.0, 10 * base_p95)
            start = time.time()
            r.set(fault_key(s.redis.prefix, "heavy"), str(inject), px=int(SLOWDOWN_S * 1000))
            end = start + SLOWDOWN_S
            time.sleep(SLOWDOWN_S + AFTER_S)
        got = sorted(values(drain(answers, lambda ms: len(ms) >= len(live.sent), timeout=60, settle=1)),
                     key=lambda a: a["answered_at"])
        answers.close()
        agent.send_signal(signal.SIGTERM)
        agent.wait(20)
    finally:
        stack.stop()
    history = store.history()
    print("\n".join(f"v{d.version} {d.updated_at - start:+.1f}s {d.updated_by}: length_threshold {d.length_threshold}, "
                    f"escalate_below {d.escalate_below}: {d.reason}" for d in history))

    def ingested(a: dict[str, Any]) -> float:
        return float(a["answered_at"] - a["timings_ms"]["total"] + a["timings_ms"]["ingest"]) / 1000

    heavy_bound = [a for a in got if int(a["request_id"].rsplit("-", 1)[1]) % len(SLOW_TEXTS) >= 10]
    off = [a for a in heavy_bound if a["tier"] != "heavy" and ingested(a) >= start]
    assert off, "no heavy-bound traffic moved off heavy"
    shifted_after = min(ingested(a) for a in off) - start
    back_after = max(ingested(a) for a in off) - end
    print(f"heavy p95 before {base_p95:.0f} ms, injected {inject:.0f} ms per batch; "
          f"shifted after {shifted_after:.1f} s; back {back_after:.1f} s after the slowdown ended")
    assert shifted_after <= 5.0
    assert back_after <= 30.0
    # From the restore until the controller's next change, heavy-bound traffic is on heavy. A loaded 2-core box
    # stalls the whole echo pipeline for ~600 ms now and then, a real spike over the SLO that may shed again later:
    # that is the controller doing its job, not heavy failing to come back.
    ours = [d for d in history if d.updated_by == "feedback"]
    restore = next((d.updated_at for d in ours if d.reason.startswith("restore") and d.updated_at > end), None)
    assert restore is not None and restore - end <= 30.0, "no restore within 30 s of the slowdown's end"
    after = min((d.updated_at for d in ours if d.updated_at > restore), default=float("inf"))
    # Routed by the restored thresholds, that is: on heavy, unless ingest's own health check degraded it for a real
    # spike (a CI run's tansu pass: heavy's p95 429 ms against the 400 ms SLO a second after the restore).
    last = [a for a in heavy_bound if restore + 1.0 <= ingested(a) < after]
    assert last and all(a["tier"] == "heavy" or "degraded_slow" in a["route_reason"] for a in last), \
        "heavy-bound traffic is not back on heavy"

    # Every version says who made it and why; the agent shed during the slowdown and restored after it.
    assert all(d.reason and d.updated_by for d in history)
    mine = [d for d in history if d.updated_by == "feedback"]
    sheds = [d for d in mine if d.reason.startswith("shed") or "shedding" in d.reason]
    restores = [d for d in mine if d.reason.startswith("restore")]
    assert sheds and restores, [d.reason for d in mine]
    assert sheds[0].updated_at >= start and sheds[0].length_threshold > setup.length_threshold
    # The restore after the slowdown returns to the values from before the first shed (a later spike may shed
    # again, see above). A restore names the version it returns to; after a second shed while heavy's backlog
    # drains, that is the first restore: follow the chain back.
    back = next(d for d in restores if d.updated_at > end)
    assert back.version > sheds[0].version
    by_version = {d.version: d for d in history}
    home = by_version[back.inputs["restore_of"]]
    while home.reason.startswith("restore") and "restore_of" in home.inputs:
        home = by_version[home.inputs["restore_of"]]
    assert home.version < sheds[0].version
    assert (back.length_threshold, back.escalate_below) == (home.length_threshold, home.escalate_below) \
        == (setup.length_threshold, setup.escalate_below)

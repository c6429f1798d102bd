"""Redis is a cache of the control topic, under real processes and steady traffic: `tierflow up`'s own Valkey killed
with SIGKILL is started again by `up` and refilled from the control topic; an external Redis flushed (FLUSHALL) is
refilled the same way. Every request is answered exactly once, and none is routed on the default thresholds."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from pipeline.adapters.model_store import ModelStore
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings
from tests.faults.conftest import Reliability
from tests.faults.harness import Agents, Observer, Traffic, Up, _children, _cmdline, trace, verify
from tests.integration.helpers import wait_ready

TIERS = ["light", "heavy", "multimodal"]
MIX = (("light", 0.4), ("medium", 0.3), ("heavy", 0.25), ("image", 0.05))
VIPS = {"u-4242", "u-7"}

pytestmark = pytest.mark.integration


def operator_state(s: Settings) -> ThresholdStore:
    """v2 routes the 52-character 'medium' texts light (the defaults would send them heavy), two VIPs, a learned
    light model live."""
    store = ThresholdStore.of(s, redis.Redis.from_url(s.redis.address))
    store.update("test", "restore test", length_threshold=60)
    store.vip_add(*VIPS)
    models = ModelStore.of(s, store.r)
    models.put("v-learned", b"\x00weights", {"trained_on": 100})
    models.set_live("v-learned", "promote", "test", "a learned model is live")
    return store


def restored(store: ThresholdStore) -> bool:
    try:
        doc = store.get_or_none()
        return (store.cache.seeded() and doc is not None and doc.version == 2 and store.vips() == VIPS
                and ModelStore(store.r, store.keys.prefix).live() == "v-learned")
    except (redis.RedisError, OSError):
        return False


def wait_restored(store: ThresholdStore, since: float, timeout: float = 30.0) -> float:
    """Seconds from `since` until Redis holds v2 and the VIPs again."""
    while not restored(store):
        assert time.monotonic() - since < timeout, "Redis was not restored from the control topic"
        time.sleep(0.01)
    return time.monotonic() - since


def port_back(port: int, since: float, timeout: float = 30.0) -> float:
    while True:
        try:
            redis.Redis(port=port, socket_connect_timeout=0.2).ping()
            return time.monotonic() - since
        except (redis.RedisError, OSError):
            assert time.monotonic() - since < timeout, "Redis did not come back"
            time.sleep(0.01)


def test_embedded_redis_killed_under_tierflow_up(settings_factory: Callable[..., Settings], tmp_path: Path,
                                                 reliability: Reliability) -> None:
    s0 = settings_factory()
    port = free_port()
    s = s0.updated(redis_url=f"redis://127.0.0.1:{port}/0", data_dir=tmp_path)
    # The test's broker, but no TIERFLOW_REDIS_URL: `up` starts its own Valkey (no --data: it comes back empty).
    env = {k: v for k, v in s0.with_env().items() if k != "TIERFLOW_REDIS_URL"}
    up = Up(s, env={"TIERFLOW_REDIS_PORT": str(port)}, base_env=env)
    try:
        port_back(port, time.monotonic(), 60)
        store = operator_state(s)
        wait_ready(s, TIERS)
        up.wait_up()  # `up` supervises its services once every agent is ready
        rate = 100.0
        with Observer(s) as obs:
            traffic = Traffic(s, "vk", int(rate * 12), rate, mix=MIX)
            with traffic:
                time.sleep(3.0)
                valkey = next(p for p in _children(up.proc.popen.pid) if "valkey" in " ".join(_cmdline(p)))
                os.kill(valkey, signal.SIGKILL)
                killed = time.monotonic()
                down_s = port_back(port, killed)
                back = killed + down_s
                restore_s = wait_restored(store, back)
                traffic.wait(traffic.duration_s + 60)
                obs.wait_for(traffic.sent, timeout=90, settle_s=2.0)
        verdict = verify(traffic.sent, obs, duplicate_bound=0)
        on_defaults = [a for a in obs.answers if a.threshold_version != 2]
        reliability.record(
            fault="embedded Valkey kill -9 under `tierflow up` (no --data: back empty)", variant="short",
            load=f"{verdict.sent_valid:,} requests at {rate:.0f}/s across all tiers",
            invariants={"`tierflow up` keeps running": up.alive(), "0 lost": not verdict.lost,
                        "no duplicates": verdict.duplicates == 0, "none routed on defaults": not on_defaults,
                        "restored within 1 s of Redis answering": restore_s <= 1.0},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered,
                    "s until Redis answered again": round(down_s, 2),
                    "s from then until thresholds v2, VIPs and the model were back": round(restore_s, 2)},
            notes="`tierflow up` starts a dead Valkey again on its port (0.5 s back-off); the ingest agent's "
                  "threshold cache finds the epoch key gone and restores every threshold version and the VIPs "
                  "from the control topic; routing meanwhile uses its last-known document.",
        )
        assert up.alive(), up.output()
        assert "redis is back on its port" in up.output(), up.output()
        assert verdict.held, (verdict.violations, trace(s, verdict.lost[:3]))
        assert not on_defaults, on_defaults[:3]
        assert restore_s <= 2.0, restore_s  # the target is 1 s (recorded above); 2 s leaves room for a busy CI
    finally:
        up.stop()


def test_external_redis_flushed_under_traffic(settings_factory: Callable[..., Settings], own_redis: Stack,
                                              reliability: Reliability) -> None:
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    store = operator_state(s)
    agents = Agents(s).start("ingest", "worker-light", "worker-heavy", "worker-multimodal", "feedback")
    rate = 100.0
    try:
        wait_ready(s, TIERS)
        with Observer(s) as obs:
            traffic = Traffic(s, "fl", int(rate * 10), rate, mix=MIX)
            with traffic:
                time.sleep(3.0)
                store.r.flushall()
                flushed = time.monotonic()
                restore_s = wait_restored(store, flushed)
                traffic.wait(traffic.duration_s + 60)
                obs.wait_for(traffic.sent, timeout=90, settle_s=2.0)
        verdict = verify(traffic.sent, obs, duplicate_bound=0)
        on_defaults = [a for a in obs.answers if a.threshold_version != 2]
        dead = agents.dead()
        reliability.record(
            fault="external Redis FLUSHALL under traffic", variant="short",
            load=f"{verdict.sent_valid:,} requests at {rate:.0f}/s across all tiers",
            invariants={"0 lost": not verdict.lost, "no duplicates": verdict.duplicates == 0,
                        "none routed on defaults": not on_defaults, "no agent died": not dead,
                        "restored within 1 s": restore_s <= 1.0},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered,
                    "s from the flush until thresholds v2, VIPs and the model were back": round(restore_s, 2)},
            notes="A flush publishes nothing: the ingest cache looks for the epoch key twice a second.",
        )
        assert not dead, [agents.log(n)[-1500:] for n in ("ingest", "feedback")]
        assert verdict.held, (verdict.violations, trace(s, verdict.lost[:3]))
        assert not on_defaults, on_defaults[:3]
        assert restore_s <= 2.0, restore_s
    finally:
        agents.stop()


def test_up_with_data_restarted_keeps_what_it_was_told(services: Settings, tmp_path: Path,
                                                      reliability: Reliability) -> None:
    """`tierflow up --data DIR`, its Valkey killed with SIGKILL, then Ctrl-C and up again: each time VIPs,
    threshold versions with their history and pins, the live learned model with its weights and history, and replay
    progress are exactly as before. On the embedded broker of the run (`make test` runs it on noida and tansu)."""
    from pipeline.adapters.model_store import ModelStore
    from pipeline.contracts.keys import Keys

    if os.environ.get("TIERFLOW_TEST_BOOTSTRAP"):
        pytest.skip("`tierflow up --data` embeds its own broker; this run is on your Kafka")
    broker = services.embedded.broker

    s = services.updated(kafka_bootstrap=None, redis_url=None, kafka_port=free_port(), redis_port=free_port(),
                         data_dir=tmp_path / "data", embedded_broker=broker)
    env = {k: v for k, v in s.with_env().items() if k not in ("TIERFLOW_KAFKA_BOOTSTRAP", "TIERFLOW_REDIS_URL")}
    env |= {"TIERFLOW_KAFKA_PORT": str(s.kafka.port), "TIERFLOW_REDIS_PORT": str(s.redis.port),
            "TIERFLOW_EMBEDDED_BROKER": broker}

    def start() -> Stack:
        stack = Stack(s)
        (stack.log_dir / "up.log").unlink(missing_ok=True)  # the log is appended to: the last run said "up" too
        stack.spawn("up", [sys.executable, "-m", "pipeline.cli", "up", "--data", str(s.data_dir)],
                    env={**env, "TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_HEAVY_MODEL": "echo",
                         "TIERFLOW_MULTIMODAL_MODEL": "echo", "TIERFLOW_ZH_MODEL": ""})
        deadline = time.monotonic() + 180
        while "tierflow is up" not in stack.tail("up", 200):
            assert stack.find("up").popen.poll() is None and time.monotonic() < deadline, stack.tail("up", 60)
            time.sleep(0.2)
        return stack

    def state(r: redis.Redis) -> dict[str, object]:
        store, models, keys = ThresholdStore.of(s, r), ModelStore(r, s.redis.prefix), Keys(s.redis.prefix)
        return {"thresholds": [d.model_dump_json() for d in store.history()], "current": store.get().model_dump(),
                "vips": store.vips(), "live": models.live(), "models": models.history(),
                "weights": models.weights("v-test"), "replay": r.hgetall(keys.replay_job("job-1")),
                "answered": r.smembers(keys.replay_answered)}

    first = start()
    try:
        r = redis.Redis(port=s.redis.port)
        store = ThresholdStore.of(s, r)
        store.update("cli:ops", "budget cut", heavy_budget=0.15)
        store.update("cli:ops", "pin heavy_budget", pinned=("heavy_budget",))
        store.vip_add(*VIPS)
        models = ModelStore(r, s.redis.prefix)
        models.put("v-test", b"\x00weights\xff", {"trained_on": 120})
        models.set_live("v-test", "promote", "trainer", "beat the packaged model by 2 points")
        keys = Keys(s.redis.prefix)
        r.hset(keys.replay_job("job-1"), mapping={"position": "[0, 42]", "sent": "42"})
        r.sadd(keys.replay_answered, "a-1", "a-2")
        before = state(r)
        time.sleep(1.2)  # the append-only file is written every second
        valkey = next(p for p in _children(first.find("up").popen.pid) if "valkey" in " ".join(_cmdline(p)))
        os.kill(valkey, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "redis is back on its port" not in first.tail("up", 50):
            assert time.monotonic() < deadline, first.tail("up", 50)
            time.sleep(0.05)
        after_kill = state(redis.Redis(port=s.redis.port))
        broker_pid = next(p for p in _children(first.find("up").popen.pid)
                          if any(b in " ".join(_cmdline(p)) for b in ("tansu", "noida-db")))
        os.kill(broker_pid, signal.SIGKILL)  # under --data, `up` starts its broker again too
        while "broker is back on its port" not in first.tail("up", 50):
            assert time.monotonic() < deadline + 60, first.tail("up", 50)
            time.sleep(0.05)
        assert first.find("up").popen.poll() is None, first.tail("up", 50)
    finally:
        first.find("up").popen.send_signal(signal.SIGINT)
        first.find("up").popen.wait(60)
        first.stop()
    again = start()
    try:
        after = state(redis.Redis(port=s.redis.port))
    finally:
        again.find("up").popen.send_signal(signal.SIGINT)
        again.find("up").popen.wait(60)
        again.stop()
    same = {k: after[k] == v and after_kill[k] == v for k, v in before.items()}
    reliability.record(
        fault=f"`tierflow up --data`: its Valkey, then its broker killed (-9), then up stopped and started "
              f"again ({broker})",
        variant="short", load="idle",
        invariants={f"{k} kept": v for k, v in same.items()},
        counts={"threshold versions": len(before["thresholds"]), "VIPs": len(VIPS)},  # type: ignore[arg-type]
        notes="The embedded Valkey keeps an append-only file under --data (written every second) and `up` starts "
              "it again when it dies; the control topic keeps threshold versions and VIPs as well, for a Redis "
              "that comes back without its file.",
    )
    assert all(same.values()), {k: (before[k], after[k]) for k, v in same.items() if not v}

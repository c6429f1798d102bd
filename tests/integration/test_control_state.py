"""Redis is a cache of the control topic: threshold versions and VIPs written through a store come back, exactly,
after the Redis that held them is flushed or restarted empty (real broker, real Valkey of the test's own)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from pipeline.adapters.control_log import ControlLog
from pipeline.adapters.model_store import ModelStore
from pipeline.adapters.threshold_store import ThresholdCache, ThresholdStore
from pipeline.contracts.keys import ControlKeys
from pipeline.ops.devstack import Stack
from pipeline.settings import Settings

pytestmark = pytest.mark.integration


def operator_state(s: Settings, r: redis.Redis) -> ThresholdStore:
    """What an operator and the controller leave behind: v1..v4 with a pin and two VIPs (one added, then gone)."""
    store = ThresholdStore.of(s, r)
    store.init()
    store.update("cli:ops", "budget cut", heavy_budget=0.15)
    store.update("feedback", "heavy p95 over the SLO", escalate_below=0.4)
    store.update("cli:ops", "pin heavy_budget", pinned=("heavy_budget",))
    store.vip_add("u-4242", "u-7", "u-gone")
    store.vip_remove("u-gone")
    return store


def snapshot(store: ThresholdStore) -> tuple[list[str], set[str]]:
    return [d.model_dump_json() for d in store.history()], store.vips()


def test_flushed_redis_is_restored_exactly(settings_factory: Callable[..., Settings], own_redis: Stack) -> None:
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    r = redis.Redis.from_url(s.redis.address)
    store = operator_state(s, r)
    before = snapshot(store)
    assert [d.version for d in store.history()] == [1, 2, 3, 4] and before[1] == {"u-4242", "u-7"}

    r.flushall()
    fresh = ThresholdStore.of(s, r)  # a process that starts on the empty Redis: it never sees the defaults
    assert fresh.get().version == 4
    assert snapshot(fresh) == before
    assert fresh.get().pinned == ("heavy_budget",)
    # the next change follows v4, and the topic has it too
    assert fresh.update("cli:ops", "after the flush", shadow_rate=0.1).version == 5
    assert ControlLog(s).read().current is not None and ControlLog(s).read().thresholds[-1].version == 5


def test_cache_restores_a_flush_under_it_within_a_second(settings_factory: Callable[..., Settings],
                                                         own_redis: Stack) -> None:
    """FLUSHALL publishes nothing: the cache notices the missing epoch and restores; its routing document never
    goes back to the defaults."""
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    r = redis.Redis.from_url(s.redis.address)
    store = operator_state(s, r)
    before = snapshot(store)
    seen: list[int] = []
    cache = ThresholdCache(ThresholdStore.of(s, redis.Redis.from_url(s.redis.address)),
                           on_change=lambda doc: seen.append(doc.version)).start()
    stop = threading.Event()
    versions: list[int] = []

    def watch() -> None:  # what routing reads, sampled every millisecond
        while not stop.is_set():
            versions.append(cache.current.version)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        time.sleep(0.3)
        r.flushall()
        flushed = time.monotonic()
        while not (store.cache.seeded() and snapshot(store) == before):
            assert time.monotonic() - flushed < 5, "Redis was not restored from the control topic"
            time.sleep(0.01)
        took = time.monotonic() - flushed
    finally:
        stop.set()
        watcher.join(2)
        cache.stop()
    assert took < 2.0, f"restored {took:.2f}s after the flush"  # 0.5 s epoch check + one read of the topic
    assert set(versions) == {4} and seen == [4], (set(versions), seen)
    assert cache.vips == frozenset({"u-4242", "u-7"})


def test_restarted_redis_is_restored(settings_factory: Callable[..., Settings], own_redis: Stack) -> None:
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    store = operator_state(s, redis.Redis.from_url(s.redis.address))
    before = snapshot(store)
    own_redis.kill("redis")
    own_redis.start_redis()  # no --data: back empty
    again = ThresholdStore.of(s, redis.Redis.from_url(s.redis.address))
    again.cache.ensure_restored()
    assert snapshot(again) == before


def test_two_restorers_do_not_fight(settings_factory: Callable[..., Settings], own_redis: Stack) -> None:
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    r = redis.Redis.from_url(s.redis.address)
    before = snapshot(operator_state(s, r))
    r.flushall()
    state = ControlLog(s).read()
    stores = [ThresholdStore.of(s, redis.Redis.from_url(s.redis.address)) for _ in range(4)]
    said: list[str | None] = []
    threads = [threading.Thread(target=lambda st=st: said.append(st.cache.restore(state))) for st in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(x is not None for x in said) == 1, said  # one restorer wins; the others find it done
    assert snapshot(stores[0]) == before


def test_redis_ahead_of_the_topic_keeps_its_versions(settings_factory: Callable[..., Settings],
                                                     own_redis: Stack) -> None:
    """Versions Redis took while the broker was away stay, and the topic is given them."""
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    r = redis.Redis.from_url(s.redis.address)
    store = operator_state(s, r)
    offline = ThresholdStore(r, s.redis.prefix)  # a writer with no topic: v5 reaches Redis only
    offline.update("cli:ops", "while the broker was away", shadow_rate=0.2)
    r.delete(store.epoch_key)  # as after a restart from Redis's own snapshot that predates the epoch
    assert store.cache.restore() is not None
    assert store.get().version == 5
    assert [d.version for d in ControlLog(s).read().thresholds] == [1, 2, 3, 4, 5]


def test_the_topic_holds_one_record_per_fact(settings_factory: Callable[..., Settings], own_redis: Stack) -> None:
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    operator_state(s, redis.Redis.from_url(s.redis.address))
    state = ControlLog(s).read()
    assert [d.version for d in state.thresholds] == [1, 2, 3, 4]
    assert state.vips == frozenset({"u-4242", "u-7"})
    assert ControlKeys.vip("u-gone") == "vip:u-gone" and state.skipped == 0


def test_learned_models_come_back_with_their_history(settings_factory: Callable[..., Settings],
                                                      own_redis: Stack) -> None:
    s = settings_factory(redis_url=own_redis.settings.redis.address)
    r = redis.Redis.from_url(s.redis.address)
    models = ModelStore.of(s, r)
    models.put("v1", b"\x00one\xff", {"trained_on": 100})
    models.put("v2", b"\x00two\xff", {"trained_on": 200})
    models.set_live("v1", "promote", "trainer", "beat the packaged model")
    models.record("reject", "v2", "trainer", "worse on the check set")
    models.update_manifest("v1", status="promoted")

    def everything(m: ModelStore) -> tuple[object, ...]:
        return (m.live(), m.versions(), m.history(), [(m.weights(v), m.manifest(v)) for v in m.versions()])

    before = everything(models)
    r.flushall()
    again = ModelStore.of(s, r)
    again.cache.ensure_restored()
    assert everything(again) == before
    # pruned versions are gone from the topic too
    few = ModelStore(r, s.redis.prefix, keep=1, log=ControlLog(s))
    few.put("v3", b"three", {})
    assert set(ControlLog(s).read().models) == set(few.versions()) == {"v1", "v3"}  # v1 live: kept

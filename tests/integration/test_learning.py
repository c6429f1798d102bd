"""The learning loop on a real broker, a real Redis and real models: light workers hot-swap a promoted version
without losing or repeating an answer; a bad candidate is never promoted; a bad model forced live is rolled
back by the trainer within its bound."""

from __future__ import annotations

import csv
import io
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pipeline.adapters.kafka import make_producer, topics_of
from pipeline.adapters.model_store import PACKAGED, ModelStore
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.agents.ingest import Ingest
from pipeline.agents.trainer import Trainer
from pipeline.contracts.topics import Tier
from pipeline.core.learning import Source
from pipeline.ops.models import submit
from pipeline.settings import Settings
from tests.conftest import Running
from tests.integration.helpers import drain, reader, values, wait_ready
from workers.model import InferenceModel
from workers.models.common import domain_artifacts
from workers.models.live import LiveLightModel
from workers.models.registry import tier_model
from workers.runner import Worker
from workers.training.data import Dataset
from workers.training.online import train_light

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def shop_messages() -> list[tuple[str, str]]:
    """(text, intent) of the shop's held-out test set: real customer messages, never trained on."""
    with (ROOT / "workers/data/bitext/test.csv").open(newline="", encoding="utf-8") as f:
        rows = [(r["text"], r["category"]) for r in csv.DictReader(f)]
    random.Random(0).shuffle(rows)
    return rows


def bad_model(s: Settings) -> bytes:
    """A char n-gram model trained on 300 shop messages with their labels shuffled: confidently wrong."""
    rows = shop_messages()[:300]
    labels = [c for _, c in rows]
    random.Random(1).shuffle(labels)
    weights, _ = train_light(Dataset([t for t, _ in rows], labels), Dataset([], []),
                             domain_artifacts(s)[0].labels)
    return weights


def send(s: Settings, rows: list[tuple[str, str]], tag: str, rate: float) -> list[str]:
    """Requests at `rate` msg/s, one user each; returns their ids."""
    p = make_producer(s)
    ids = []
    t0 = time.monotonic()
    for i, (text, _) in enumerate(rows):
        rid = f"{tag}-{i}"
        p.produce(topics_of(s).requests, orjson.dumps({"id": rid, "text": text, "user_id": f"{tag}-u{i}"}), key=rid)
        ids.append(rid)
        p.poll(0)
        ahead = (i + 1) / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    assert p.flush(30) == 0
    return ids


def wait_for(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.5)


def judged(store: ModelStore, trainer: Trainer, tmp_path: Path, weights: bytes, s: Settings) -> dict[str, Any]:
    """Submit `weights` once the trainer holds 30 held-out examples; its manifest once the trainer judged it."""
    wait_for(lambda: len(trainer.store.held_out()) >= 30, 60)
    path = tmp_path / "candidate.npz"
    path.write_bytes(weights)
    version = submit(store, path, "test", s)
    wait_for(lambda: store.manifest(version)["status"] != "submitted", 60)
    return store.manifest(version)


def answers_of(s: Settings, ids: set[str], timeout: float = 180.0) -> list[dict[str, Any]]:
    """Every answer record for `ids` (all of them, duplicates included), once each id has one."""
    c = reader(s, topics_of(s).answers)
    try:
        msgs = drain(c, lambda ms: ids <= {v["request_id"] for v in values(ms)}, timeout, settle=1.0)
    finally:
        c.close()
    return [v for v in values(msgs) if v["request_id"] in ids]


@pytest.fixture
def learning(settings_factory: Callable[..., Settings], running: Running,
             packaged_models: dict[Tier, InferenceModel]) -> Iterator[tuple[Settings, list[LiveLightModel]]]:
    """Ingest, two light workers (hot-swapping, English only), a heavy worker; half of light's traffic shadowed
    on heavy, so heavy answers (the trainer's examples and evidence) come for most messages."""
    s = settings_factory(zh_model="", light_zh_model="", learn_min_eval=30, learn_holdout=0.5,
                         learn_retrain_every=10**6, learn_retrain_s=10**6, learn_min_labels=10**6,
                         learn_watch_results=60)
    ThresholdStore(redis.Redis.from_url(s.redis.address), s.redis.prefix).update("test", "shadow half",
                                                                                   shadow_rate=0.5)
    lights = [tier_model(s, Tier.LIGHT) for _ in range(2)]
    assert all(isinstance(m, LiveLightModel) for m in lights)
    running.start(Ingest(s))
    for i, m in enumerate(lights):
        running.start(Worker(s, Tier.LIGHT, m, worker_id=f"light-{i}"))
    running.start(Worker(s, Tier.HEAVY, packaged_models[Tier.HEAVY]))
    wait_ready(s, ["light", "heavy"])
    yield s, lights  # type: ignore[misc]
    for m in lights:
        m.close()


def test_a_promotion_hot_swaps_every_light_worker_without_losing_or_repeating_an_answer(
        learning: tuple[Settings, list[LiveLightModel]]) -> None:
    s, lights = learning
    store = ModelStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
    version = "light-test-swap"
    buf = io.BytesIO()
    lights[0].packaged.save(buf)  # the same weights under a new version: the swap shows in the answers' model
    store.put(version, buf.getvalue(), {"version": version, "labels": lights[0].packaged.labels,
                                        "status": "candidate"})
    rows = [r for r in shop_messages() if len(r[0]) <= 60][:400]
    promoted = threading.Timer(3.0, lambda: store.set_live(version, "promote", "test", "hot swap under load"))
    promoted.start()
    ids = send(s, rows, "swap", rate=80.0)
    promoted.join()
    got = answers_of(s, set(ids))
    per_id = Counter(a["request_id"] for a in got)
    assert set(per_id) == set(ids), f"{len(set(ids) - set(per_id))} requests never answered"
    assert max(per_id.values()) == 1, "a request was answered twice"
    light_models = Counter(a["model"] for a in got if a["tier"] == "light")
    name = lights[0].packaged.name
    assert light_models[name] > 0 and light_models[f"{name}@{version}"] > 0, light_models
    assert [m.version for m in lights] == [version, version]
    assert [m.swaps for m in lights] == [1, 1]


def test_a_bad_candidate_is_never_promoted(learning: tuple[Settings, list[LiveLightModel]], running: Running,
                                           tmp_path: Path) -> None:
    s, lights = learning
    trainer = running.start(Trainer(s))
    store = ModelStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
    ids = send(s, shop_messages()[:300], "bad", rate=100.0)
    answers_of(s, set(ids))
    manifest = judged(store, trainer, tmp_path, bad_model(s), s)  # trained on shuffled labels
    assert manifest["status"] == "rejected", manifest
    agreement = manifest["evaluation"]["agreement"]
    assert agreement["n"] >= 30 and agreement["hi"] < 0, agreement  # clearly worse, not merely unproven
    assert store.live() == PACKAGED and [m.version for m in lights] == [PACKAGED, PACKAGED]
    events = store.history()
    assert [e["action"] for e in events] == ["submit", "reject"]
    assert events[-1]["who"] == "trainer" and "agreement with heavy" in events[-1]["why"]


def test_a_candidate_that_beats_the_live_model_is_promoted_and_served_by_every_worker(
        learning: tuple[Settings, list[LiveLightModel]], running: Running, tmp_path: Path) -> None:
    s, lights = learning
    store = ModelStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
    bad = "light-test-live-bad"
    store.put(bad, bad_model(s), {"version": bad, "labels": lights[0].packaged.labels, "status": "candidate"})
    store.set_live(bad, "promote", "test", "forced: a weak model is live")
    # the watch would roll the weak model back on its own: here the candidate has to win on evidence instead
    trainer = running.start(Trainer(s.updated(learn_escalation_rise=1.0, learn_agreement_drop=1.0)))
    ids = send(s, shop_messages()[:300], "good", rate=100.0)
    answers_of(s, set(ids))
    buf = io.BytesIO()
    lights[0].packaged.save(buf)  # the pack's own model: far better than the shuffled one live
    manifest = judged(store, trainer, tmp_path, buf.getvalue(), s)
    version = manifest["version"]
    assert manifest["status"] == "promoted", manifest
    agreement = manifest["evaluation"]["agreement"]
    assert agreement["lo"] > 0 and agreement["live"] < agreement["candidate"], agreement
    assert store.live() == version and store.history()[-1]["who"] == "trainer"
    wait_for(lambda: [m.version for m in lights] == [version, version], 10)
    assert [m.version for m in lights] == [version, version]


def test_a_bad_model_forced_live_is_rolled_back_within_its_bound(
        learning: tuple[Settings, list[LiveLightModel]], running: Running) -> None:
    s, lights = learning
    trainer = running.start(Trainer(s))
    store = ModelStore(redis.Redis.from_url(s.redis.address), s.redis.prefix)
    rows = [r for r in shop_messages() if len(r[0]) <= 60]
    before = send(s, rows[:150], "before", rate=100.0)  # the packaged model's baseline
    answers_of(s, set(before))
    version = "light-test-bad"
    store.put(version, bad_model(s), {"version": version, "labels": lights[0].packaged.labels,
                                      "status": "candidate"})
    store.set_live(version, "promote", "test", "forced: an operator's mistake", {"forced": True})
    after = send(s, rows[150:450], "after", rate=50.0)
    got = answers_of(s, set(after))
    wait_for(lambda: store.live() == PACKAGED, 30)
    assert store.live() == PACKAGED, store.history()
    rollback = store.history()[-1]
    assert rollback["action"] == "rollback" and rollback["who"] == "trainer" and rollback["previous"] == version
    assert rollback["evidence"]["parent_baseline"]["results"] > 0
    assert store.manifest(version)["status"] == "rolled_back"
    live = rollback["evidence"]["live"]
    # judged on its bound's worth of evidence, not less: 60 results for the escalation rate, 30 agreement pairs
    assert ("escalation rate" in rollback["why"] and live["results"] >= 60) or \
        ("agreement" in rollback["why"] and live["pairs"] >= 30), rollback
    per_id = Counter(a["request_id"] for a in got)
    assert set(per_id) == set(after) and max(per_id.values()) == 1  # its escalations were answered by heavy
    # What it handled at all: its bound (60 results, or the results behind 30 pairs) and what was in flight until
    # the swap back (50 msg/s, a 1 s tick, a poll).
    c = reader(s, topics_of(s).results)
    try:
        results = values(drain(c, lambda ms: False, 5.0))
    finally:
        c.close()
    by_bad = [r for r in results if r["stage"] == "light" and r["model"].endswith(f"@{version}")]
    assert 30 <= len(by_bad) <= 60 + 150, len(by_bad)
    assert sum(not r["final"] for r in by_bad) > 0.5 * len(by_bad)  # unsure of everything: escalated
    assert trainer.live_version == PACKAGED


def test_one_user_flooding_one_wrong_label_through_the_topics_is_capped(
        settings_factory: Callable[..., Settings], running: Running) -> None:
    """Adversarial traffic on the real topics: one user sends 2,000 messages and labels every one `get_refund`;
    200 honest users label theirs truly. The trainer keeps `per_user` of the flood and every honest label."""
    s = settings_factory(zh_model="", learn_per_user=20, learn_per_minute=100_000)
    trainer = running.start(Trainer(s))
    rows = [r for r in shop_messages() if r[1] != "get_refund"][:200]
    requests, labels = [], []
    for i in range(2000):
        text, _ = rows[i % len(rows)]
        requests.append({"id": f"evil-{i}", "text": text, "user_id": "mallory"})
        labels.append({"request_id": f"evil-{i}", "intent": "get_refund"})
    for i, (text, intent) in enumerate(rows):
        requests.append({"id": f"ok-{i}", "text": text, "user_id": f"user-{i}"})
        labels.append({"request_id": f"ok-{i}", "intent": intent})
    labels.append({"request_id": "ok-0", "intent": "track_order", "note": "not in the schema"})  # refused
    p = make_producer(s)
    for req in requests:
        p.produce(topics_of(s).requests, orjson.dumps(req), key=req["id"])
    assert p.flush(30) == 0
    for lab in labels:
        p.produce(topics_of(s).labels, orjson.dumps(lab), key=lab["request_id"])
    assert p.flush(30) == 0
    wait_for(lambda: sum(trainer.store.counts.values()) >= 2200, 60)
    kept = list(trainer.store.examples.values())
    assert sum(e.user == "mallory" for e in kept) == 20
    assert sum(e.user != "mallory" for e in kept) == 200
    assert trainer.store.examples["ok-0"].intent == rows[0][1]  # the out-of-schema label changed nothing
    assert sum(e.intent == "get_refund" for e in kept) == 20  # none of the honest rows is a refund


def test_a_retraining_that_finishes_while_redis_refuses_writes_is_stored_once_redis_is_back(
        settings_factory: Callable[..., Settings], tmp_path: Path) -> None:
    """Redis stops taking writes (CLIENT PAUSE WRITE) as a retraining finishes: the tick that stores it fails, the
    weights read from the finished child are kept, and the next tick stores and judges them as one version."""
    rows = shop_messages()
    seed = tmp_path / "seed.csv"
    with seed.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "category"), *rows[:300]])
    s = settings_factory(zh_model="", learn_seed_data=seed, learn_retrain_every=50, learn_per_minute=10**6)
    admin = redis.Redis.from_url(s.redis.address)
    trainer = Trainer(s, redis.Redis.from_url(s.redis.address, socket_timeout=0.5))
    now = int(time.time() * 1000)
    for i, (text, intent) in enumerate(rows[300:400]):
        trainer.store.offer(f"r{i}", text, intent, Source.LABEL, f"u{i}", now)
    trainer.tick(now)
    assert trainer.training is not None
    trainer.training.proc.wait(120)
    admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")  # lifted below; long enough for a loaded machine
    try:
        with pytest.raises(redis.RedisError):
            trainer.tick(now)
        assert trainer.training is not None and trainer.training.output is not None
        assert not trainer.training.workdir.exists()  # read once: the child's files are gone
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    trainer.tick(now)
    assert trainer.training is None and trainer.trained == 1
    store = ModelStore(admin, s.redis.prefix)
    [version] = [v for v in store.versions() if v != PACKAGED]
    manifest = store.manifest(version)
    assert manifest["status"] in ("promoted", "rejected") and "agreement" in manifest["evaluation"], manifest
    assert [e["version"] for e in store.history() if e["action"] in ("promote", "reject")] == [version]


def test_models_history_says_so_when_nothing_changed_yet(settings_factory: Callable[..., Settings]) -> None:
    """An operator's first `tierflow models history` gets a line, not an empty screen."""
    s = settings_factory()
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "models", "history"],
                         env={**os.environ, **s.with_env()}, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "no model changes yet: the packaged light model has been live since the start"


def test_a_retraining_cross_fits_only_the_examples_the_live_model_never_saw(
        settings_factory: Callable[..., Settings], tmp_path: Path) -> None:
    """Each retraining's evidence pools the candidate's held-out answers with the fold models' answers on heavy's
    examples newer than the live model's data: all of them under the packaged model, only the later ones once a
    learned version is live."""
    rows = shop_messages()
    seed = tmp_path / "seed.csv"
    with seed.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "category"), *rows[:300]])
    s = settings_factory(zh_model="", learn_seed_data=seed, learn_retrain_every=50, learn_retrain_growth=0.0,
                         learn_retrain_s=600.0, learn_per_minute=10**6, learn_min_eval=10, learn_holdout=0.3)
    trainer = Trainer(s)
    store = ModelStore(trainer.r, s.redis.prefix)
    t0 = int(time.time() * 1000)

    def offer(first: int, last: int) -> None:  # heavy's confident answers, one a millisecond
        for i in range(first, last):
            text, intent = rows[i]
            trainer.store.offer(f"r{i}", text, intent, Source.HEAVY, f"u{i}", t0 + i, 0.99)

    def retrain() -> dict[str, Any]:
        trainer.tick(t0)
        assert trainer.training is not None
        trainer.training.proc.wait(180)
        trainer.tick(t0)
        assert trainer.training is None
        return store.manifest(store.versions()[0])  # newest first

    offer(300, 700)
    first = retrain()
    ev, report = first["evaluation"], first["training"]
    training = [e for e in trainer.store.examples.values() if not e.held_out]
    assert report["crossfit_examples"] == len(training) > 200, report  # the packaged model saw none of them
    assert report["crossfit_seconds"] > 0
    assert ev["pooled"]["n"] == ev["agreement"]["n"] + len(training), ev
    assert "crossfit" not in report  # the per-example answers stay out of the manifest

    # RETRAIN_S counts from the end of the last retraining: a few new examples wait for it (the trainer's clock is
    # moved past it, not waited on: under load the steps above can take longer than any short RETRAIN_S)
    offer(700, 705)
    trainer.tick(t0)
    assert trainer.training is None
    trainer.last_train -= s.learn.retrain_s
    trainer.tick(t0)
    assert trainer.training is not None
    trainer.training.proc.wait(180)
    trainer.tick(t0)

    store.set_live(first["version"], "promote", "test", "an operator's promote")  # the trainer follows the pointer
    offer(705, 900)
    second = retrain()
    newer = [e for e in trainer.store.examples.values() if not e.held_out and e.at_ms > first["data"]["to_ms"]]
    assert second["parent"] == first["version"] and second["data"]["examples"] > first["data"]["examples"] + 100
    assert second["training"]["crossfit_examples"] == len(newer) > 80
    assert second["evaluation"]["pooled"]["n"] == second["evaluation"]["agreement"]["n"] + len(newer)

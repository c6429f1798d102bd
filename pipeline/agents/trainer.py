"""The trainer agent (`tierflow learn`): the light model learns from the heavy tier's answers and from labels,
and a new version goes live only on evidence, and comes back out when live traffic says it is worse.

One loop over three topics, read from `learn.window_s` ago (no committed offsets: the store is rebuilt from the
log on a restart, so a crash loses nothing and needs no snapshot):
- `tierflow.requests`: each request's text, user and language, held a while (`learn.texts` at most) to join;
- `tierflow.results`: heavy's answers (final, escalated or shadow) at or above `heavy_floor` become examples;
  light's results feed the live watch (escalation rate, agreement with heavy per model version);
- `tierflow.labels` (and a request's own `label`): ground truth, which replaces heavy's guess for its request.
The decisions (what is an example, when to promote, when to roll back) are `pipeline/core/learning.py`'s.

Retraining runs `python -m workers.training.online` as a child process once new examples reach `retrain_every` and
`retrain_growth` of the last retraining's (or after `retrain_s` with any), never on the loop; with `crossfit_folds`
it also fits one model without each fold of the examples the live model never saw, which answers that fold. The
candidate and the live model then answer the held-out examples, and the live model the fold examples; promotion
moves the live pointer in Redis (pipeline/adapters/model_store.py) and every light worker hot-swaps
(workers/models/live.py). Each decision is in the model history with who, why and the evidence.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from pipeline import metrics
from pipeline.adapters.heartbeats import AGENT, Heartbeat
from pipeline.adapters.kafka import make_consumer, topics_of
from pipeline.adapters.model_store import PACKAGED, ModelStore
from pipeline.adapters.probes import READINESS
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import Keys
from pipeline.contracts.models import Label, decode_model
from pipeline.contracts.records import fast_request, result_of
from pipeline.contracts.topics import Tier
from pipeline.core.features import lang_of, script_of
from pipeline.core.learning import (
    Decision,
    Example,
    ExampleStore,
    Guards,
    LiveRecord,
    PromotionPolicy,
    RetrainPolicy,
    RollbackPolicy,
    Source,
    Verdict,
    correct,
    crossfit_folds,
    decide_promotion,
    decide_rollback,
    paired_delta,
    retrain_due,
)
from pipeline.errors import InvalidMessage
from pipeline.settings import Settings
from workers.model import Item
from workers.models.charngram import CharNgramClassifier

log = logging.getLogger(__name__)

WHO = "trainer"


@dataclass
class Training:
    """A retraining in flight: the child process and what it was given."""

    proc: subprocess.Popen[bytes]
    workdir: Path
    parent: str
    examples: list[Example]
    started: float
    # Read once when the child exits (its files are then removed); stored and judged until Redis takes them.
    output: tuple[bytes, dict[str, Any]] | None = None
    crossfit: list[tuple[Example, str]] | None = None  # (fold example, what the model without its fold said)
    version: str | None = None


class Trainer:
    """Examples in, light model versions out. `run()` until `stop()`."""

    def __init__(self, settings: Settings, r: redis.Redis | None = None) -> None:
        self.s, self.cfg = settings, settings.learn
        self.topics = topics_of(settings)
        self.r = r or make_redis(settings)
        self.models = ModelStore.of(settings, self.r)
        self.models.cache.ensure_restored()  # an empty Redis gets its versions back before the first is stored
        self.packaged = CharNgramClassifier.from_settings(settings, Tier.LIGHT)
        self.labels = list(self.packaged.labels)
        cfg = self.cfg
        self.store = ExampleStore(frozenset(self.labels), Guards(
            heavy_floor=cfg.heavy_floor, per_user=cfg.per_user, per_minute=cfg.per_minute, holdout=cfg.holdout,
            window=cfg.window, window_ms=int(cfg.window_s * 1000)))
        self.promotion = PromotionPolicy(cfg.margin, cfg.label_margin, cfg.min_eval, cfg.min_labels)
        self.retrain = RetrainPolicy(cfg.retrain_every, cfg.retrain_growth, cfg.retrain_s)
        self.rollback_policy = RollbackPolicy(cfg.escalation_rise, cfg.agreement_drop, cfg.watch_results)
        # request id -> (text, user, lang): what a later answer or label is joined with
        self.texts: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        self.light_of: OrderedDict[str, tuple[str, str]] = OrderedDict()  # rid -> (light model, its intent)
        self.heavy_of: OrderedDict[str, str] = OrderedDict()  # rid -> heavy's intent, before light's result
        # rid -> offers (intent, source, at, confidence) that came before the request's text
        self.awaiting: OrderedDict[str, list[tuple[str, Source, int, float]]] = OrderedDict()
        self.live_records: dict[str, LiveRecord] = {}  # light model name -> its recent outcomes
        self.watching: tuple[str, dict[str, Any]] | None = None  # (promoted version, its parent's baseline)
        self.live_version = self._live_when_redis_answers()
        self.training: Training | None = None
        self.last_train = time.monotonic()  # when the last retraining ended (or the agent started)
        self.last_used = 0  # training examples the last retraining used
        self.trained = 0
        self._loaded: dict[str, CharNgramClassifier] = {}
        self._stop = threading.Event()
        self.ready = False

    def stop(self) -> None:
        self._stop.set()

    def _live_when_redis_answers(self, timeout_s: float = 60.0) -> str:
        """The live version; Redis slow or down at start (a loaded host, a restart) is waited for, not fatal."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.models.live()
            except (redis.RedisError, OSError):
                metrics.REDIS_ERRORS.labels("trainer").inc()
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    # --- the loop ---
    def readiness(self) -> dict[str, bool]:
        return {"partitions_assigned": self.ready}

    def run(self) -> None:
        READINESS.require(self.readiness)
        beat = Heartbeat(self.r, self.s.redis.prefix, AGENT, f"trainer-{socket.gethostname()}-{os.getpid()}",
                         self.s.heartbeat.interval_s, self.s.heartbeat.ttl_s,
                         lambda: {"agent": "trainer", "ready": self.ready}).start()
        log.info("trainer: %s + %s + %s -> light model versions (live: %s)", self.topics.requests,
                 self.topics.results, self.topics.labels, self.live_version)
        consumer = make_consumer(self.s, self.s.group("trainer"))
        try:
            consumer.assign(self._start_positions(consumer))
            self.ready = True
            last_tick = 0.0
            while not self._stop.is_set():
                for msg in consumer.consume(1000, 0.2):
                    if msg.error() is None:
                        self.handle(msg)
                if time.monotonic() - last_tick >= 1.0:
                    try:
                        self.tick(int(time.time() * 1000))
                    except (redis.RedisError, OSError) as e:  # decisions wait for Redis; examples keep coming
                        metrics.REDIS_ERRORS.labels("trainer").inc()
                        log.warning("trainer: Redis unavailable (%s); deciding again in a second", e)
                    last_tick = time.monotonic()
        finally:
            READINESS.release(self.readiness)
            beat.stop()
            if self.training is not None:
                self.training.proc.kill()
                self.training.proc.wait()
                shutil.rmtree(self.training.workdir, ignore_errors=True)
            consumer.close()

    def _start_positions(self, consumer: Consumer) -> list[TopicPartition]:
        """Every partition of the three topics, from `window_s` ago (the beginning where the broker cannot say)."""
        since = int((time.time() - self.cfg.window_s) * 1000)
        wanted = []
        for topic in (self.topics.requests, self.topics.results, self.topics.labels):
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            wanted += [TopicPartition(topic, p, since) for p in sorted(meta.partitions)]
        try:
            found = consumer.offsets_for_times(wanted, timeout=10)
        except Exception:  # noqa: BLE001 - a broker that cannot look times up: read all it keeps
            return [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in wanted]
        return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                for tp in found]

    def handle(self, msg: Message) -> None:
        topic, raw = msg.topic(), msg.value()
        if raw is None:
            return
        ts = msg.timestamp()[1]
        now = ts if ts > 0 else int(time.time() * 1000)
        if topic == self.topics.requests:
            self.on_request(raw, now)
        elif topic == self.topics.results:
            self.on_result(raw, now)
        elif topic == self.topics.labels:
            self.on_label(raw, now)

    def on_request(self, raw: bytes, now: int) -> None:
        d = fast_request(raw)
        if d is None:
            try:
                d = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return
            if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not isinstance(d.get("text"), str):
                return  # an image-only or invalid request: nothing to learn from (ingest dead-lettered it)
        rid, text = d["id"], d["text"]
        hint = d.get("lang")
        lang = lang_of(script_of(text), hint if isinstance(hint, str) else None)
        user = d.get("user_id") if isinstance(d.get("user_id"), str) else f"anonymous:{rid}"
        _put(self.texts, rid, (text, str(user), lang), self.cfg.texts)
        for intent, source, at, confidence in self.awaiting.pop(rid, ()):
            self._offer(rid, intent, source, at, confidence)
        label = d.get("label")
        if isinstance(label, str):
            self._offer(rid, label, Source.LABEL, now)

    def on_result(self, raw: bytes, now: int) -> None:
        res = result_of(raw)
        if res is None:
            return
        try:
            rid, stage, intent, model = res["request_id"], res["stage"], res["intent"], res["model"]
            confidence = float(res["confidence"])
        except (KeyError, TypeError, ValueError):
            return
        if stage == "light":
            if res.get("shadow") or res.get("replay"):
                return
            record = self.live_records.setdefault(model, LiveRecord())
            record.result(escalated=not res.get("final", True))
            _put(self.light_of, rid, (model, intent), self.cfg.texts)
            heavy = self.heavy_of.pop(rid, None)
            if heavy is not None:
                record.pair(intent == heavy)
        elif stage == "heavy":
            light = self.light_of.get(rid)
            if light is not None:
                self.live_records.setdefault(light[0], LiveRecord()).pair(light[1] == intent)
            elif res.get("shadow"):
                _put(self.heavy_of, rid, intent, self.cfg.texts)
            self._offer(rid, intent, Source.HEAVY, now, confidence)

    def on_label(self, raw: bytes, now: int) -> None:
        try:
            label = decode_model(Label, raw)  # the schema's fields only: anything else is refused
        except InvalidMessage:
            return
        if label.intent is None:
            return  # a rating: nothing to learn an intent from
        light = self.light_of.get(label.request_id)
        if light is not None:
            self.live_records.setdefault(light[0], LiveRecord()).pair(light[1] == label.intent)
        self._offer(label.request_id, label.intent, Source.LABEL, now)

    def _offer(self, rid: str, intent: str, source: Source, now: int, confidence: float = 1.0) -> None:
        seen = self.texts.get(rid)
        if seen is None:
            # The topics are read side by side: an answer or a label may come before its request's text (always so
            # for a while after a restart, which re-reads all three). It waits for the text, a bounded while.
            self.awaiting.setdefault(rid, []).append((intent, source, now, confidence))
            while len(self.awaiting) > self.cfg.texts:
                _, dropped = self.awaiting.popitem(last=False)
                for _, src, _, _ in dropped:
                    self.store.counts[Verdict.NO_TEXT] += 1
                    metrics.LEARN_EXAMPLES.labels(src.value, Verdict.NO_TEXT.value).inc()
            return
        text, user, lang = seen
        verdict = self.store.offer(rid, text, intent, source, user, now, confidence, lang)
        metrics.LEARN_EXAMPLES.labels(source.value, verdict.value).inc()

    # --- training, promotion, the live watch ---
    def tick(self, now_ms: int) -> None:
        self._follow_pointer()
        if self.training is not None:
            t = self.training
            if t.proc.poll() is not None:
                # `retrain_s` counts from here: a retraining longer than it would otherwise start the next at once,
                # on the few examples that came meanwhile (measured: +312 on 3,603, 7 CPU-minutes, no better model)
                self.last_train = time.monotonic()
                if t.output is not None or self._collect(t):
                    self._store(t)  # a Redis error leaves `t` for the next tick, which stores what was read
                self.training = None
        elif self._due():
            self.training = self._start_training(now_ms)
        self._judge_submitted()
        self._watch()
        self.save_state(now_ms)

    def _due(self) -> bool:
        return retrain_due(self.store.new_training, self.last_used, time.monotonic() - self.last_train, self.retrain)

    def _start_training(self, now_ms: int) -> Training:
        live_to_ms = self._data_end(self.live_version)  # before taking: a Redis error leaves the count of new ones
        examples = self.store.take_training()
        self.last_used = len(examples)
        folds = crossfit_folds(examples, live_to_ms, self.cfg.crossfit_folds)
        workdir = Path(tempfile.mkdtemp(prefix="tierflow-learn-"))
        (workdir / "examples.jsonl").write_bytes(b"".join(
            orjson.dumps({"text": e.text, "intent": e.intent} if f is None else
                         {"text": e.text, "intent": e.intent, "fold": f}) + b"\n"
            for e, f in zip(examples, folds, strict=True)))
        (workdir / "labels.json").write_text(json.dumps(self.labels))
        cmd = [sys.executable, "-m", "workers.training.online", "--examples", str(workdir / "examples.jsonl"),
               "--labels", str(workdir / "labels.json"), "--out", str(workdir / "model.npz"),
               "--report", str(workdir / "report.json")]
        cmd += ["--seed-csv", str(self.cfg.seed_data)] if self.cfg.seed_data else ["--domain", self.s.domain]
        n_folded = sum(f is not None for f in folds)
        log.info("trainer: retraining on %d examples (parent %s; %d new to it, cross-fitted in %d folds)",
                 len(examples), self.live_version, n_folded, self.cfg.crossfit_folds if n_folded else 0)
        with (workdir / "stderr").open("wb") as err:  # the child keeps its own descriptor: ours is closed here
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        return Training(proc, workdir, self.live_version, examples, time.monotonic())

    def _data_end(self, version: str) -> int | None:
        """The newest example `version` was trained on (None: none of the store's, or not known, as for a submitted
        model: then every new example counts as unseen, which can only favour the live model)."""
        if version == PACKAGED:
            return None
        end = self.models.manifest(version).get("data", {}).get("to_ms")
        return int(end) if isinstance(end, int | float) else None

    def _collect(self, t: Training) -> bool:
        """Read a finished child's weights and report into `t` and remove its files; False if it failed."""
        try:
            if t.proc.returncode != 0:
                err = (t.workdir / "stderr").read_text(errors="replace").strip().splitlines()
                log.error("trainer: retraining failed (%s): %s", t.proc.returncode, err[-1] if err else "")
                metrics.LEARN_TRAININGS.labels("failed").inc()
                return False
            report = json.loads((t.workdir / "report.json").read_text())
            predicted = report.pop("crossfit", None)  # per example: too long for the manifest
            t.crossfit = [] if predicted is None else [
                (e, p) for e, p in zip(t.examples, predicted, strict=True) if p is not None]
            report["crossfit_examples"] = len(t.crossfit)
            t.output = (t.workdir / "model.npz").read_bytes(), report
        finally:
            for f in t.workdir.iterdir():
                f.unlink()
            t.workdir.rmdir()
        self.trained += 1
        metrics.LEARN_TRAININGS.labels("done").inc()
        return True

    def _store(self, t: Training) -> None:
        """Store a retraining's version with its manifest, then judge it (named once: a retry rewrites the same)."""
        assert t.output is not None
        weights, report = t.output
        version = t.version = t.version or version_name(t.examples)
        by_source = {s.value: sum(e.source is s for e in t.examples) for s in Source}
        manifest = {
            "version": version, "parent": t.parent, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "status": "candidate", "labels": self.labels, "who": WHO,
            "data": {"examples": len(t.examples), "by_source": by_source,
                     "from_ms": min((e.at_ms for e in t.examples), default=None),
                     "to_ms": max((e.at_ms for e in t.examples), default=None),
                     "seed": str(self.cfg.seed_data) if self.cfg.seed_data else f"domain:{self.s.domain}"},
            "training": {**report, "seconds_wall": round(time.monotonic() - t.started, 1)},
        }
        if version != self.live_version:  # else: promoted before Redis failed; only its status is left to write
            self.models.put(version, weights, manifest)
        # Cross-fitted evidence is against the parent the folds were cut for; a pointer moved meanwhile voids it.
        self.consider(version, t.crossfit if t.parent == self.live_version else None)

    def consider(self, version: str, crossfit: Sequence[tuple[Example, str]] | None = None) -> Decision:
        """Shadow-evaluate `version` against the live model on the held-out examples (and, from its retraining, the
        fold models' answers on the examples the live model never saw); promote or reject it."""
        if version == self.live_version:  # promoted, then Redis failed before its status was written
            self.models.update_manifest(version, status="promoted")
            return Decision(True, "already live")
        candidate = self._model(version)
        live = self._model(self.live_version)
        outcomes = self.evaluate(candidate, live)
        deltas = {name: paired_delta(*pair) for name, pair in outcomes.items()}
        pooled = None
        if crossfit:
            cand, base = outcomes["agreement"]
            examples = [e for e, _ in crossfit]
            live_said = live.predict([Item(e.text, "en", None) for e in examples])
            pooled = deltas["pooled"] = paired_delta(
                cand + [p == e.intent for e, p in crossfit],
                base + [p.intent == e.intent for e, p in zip(examples, live_said, strict=True)])
        evidence: dict[str, Any] = {k: d.as_dict() for k, d in deltas.items()}
        decision = decide_promotion(deltas["agreement"], deltas["labelled"], self.promotion, pooled)
        # The evidence first: kept if Redis fails below (a retry then finds the version live, or judges it again).
        self.models.update_manifest(version, evaluation=evidence, decision=decision.why)
        if decision.promote:  # the pointer first: a reader that sees the status promoted finds it live
            baseline = self._record_of(self.live_version).summary()
            self.models.set_live(version, "promote", WHO, decision.why, {**evidence, "parent_baseline": baseline})
            self._now_live(version, baseline)
            metrics.LEARN_DECISIONS.labels("promote").inc()
        else:
            self.models.record("reject", version, WHO, decision.why, evidence)
            metrics.LEARN_DECISIONS.labels("reject").inc()
        self.models.update_manifest(version, status="promoted" if decision.promote else "rejected")
        log.info("trainer: %s %s: %s", "promoted" if decision.promote else "rejected", version, decision.why)
        return decision

    def evaluate(self, candidate: CharNgramClassifier,
                 live: CharNgramClassifier) -> dict[str, tuple[list[bool], list[bool]]]:
        """Both models on the held-out examples: who was right, per example, on heavy's answers and on labels."""
        out: dict[str, tuple[list[bool], list[bool]]] = {}
        for name, source in (("agreement", Source.HEAVY), ("labelled", Source.LABEL)):
            held = self.store.held_out(source)
            items = [Item(e.text, "en", None) for e in held]
            truth = [e.intent for e in held]
            cand = correct([p.intent for p in candidate.predict(items)], truth) if held else []
            base = correct([p.intent for p in live.predict(items)], truth) if held else []
            out[name] = (cand, base)
        return out

    def _judge_submitted(self) -> None:
        """Candidates an operator submitted (`tierflow models submit`) are judged like the trainer's own."""
        for version in self.models.versions()[:5]:
            if self.models.manifest(version).get("status") == "submitted":
                self.consider(version)

    def _follow_pointer(self) -> None:
        """A pointer moved by someone else (an operator's promote or rollback): watch what is live now."""
        live = self.models.live()
        if live != self.live_version:
            self._now_live(live, self._record_of(self.live_version).summary())

    def _now_live(self, version: str, parent_baseline: dict[str, Any]) -> None:
        previous, self.live_version = self.live_version, version
        self.watching = (version, parent_baseline) if version != PACKAGED else None
        self.live_records.pop(self._name_of(version), None)  # judged on what it does from now on
        log.info("trainer: live light model %s (was %s)", version, previous)

    def _watch(self) -> None:
        """Roll back a promoted version whose live escalation rate or agreement went past its bound."""
        if self.watching is None:
            return
        version, baseline = self.watching
        record = self.live_records.get(self._name_of(version))
        if record is None:
            return
        reason = decide_rollback(record, baseline, self.rollback_policy)
        if reason is None:
            return
        parent = self.models.parent_of_live() or PACKAGED
        self.models.set_live(parent, "rollback", WHO, reason, {"live": record.summary(), "parent_baseline": baseline})
        self.models.update_manifest(version, status="rolled_back", decision=reason)
        metrics.LEARN_DECISIONS.labels("rollback").inc()
        log.warning("trainer: rolled %s back to %s: %s", version, parent, reason)
        self._now_live(parent, record.summary())
        self.watching = None  # the parent was fine before: not judged against the model it replaced

    def _record_of(self, version: str) -> LiveRecord:
        return self.live_records.get(self._name_of(version)) or LiveRecord()

    def _name_of(self, version: str) -> str:
        return self.packaged.name if version == PACKAGED else f"{self.packaged.name}@{version}"

    def _model(self, version: str) -> CharNgramClassifier:
        """The model of `version`, loaded from Redis once; only the live one and the last one asked for are kept."""
        if version == PACKAGED:
            return self.packaged
        if version not in self._loaded:
            model = CharNgramClassifier.load(io.BytesIO(self.models.weights(version)), self.labels)
            model.answers, model.name = self.packaged.answers, self._name_of(version)
            self._loaded = {v: m for v, m in self._loaded.items() if v == self.live_version}
            self._loaded[version] = model
        return self._loaded[version]

    # --- what `tierflow models list` shows ---
    def state(self, now_ms: int) -> dict[str, Any]:
        return {"at_ms": now_ms, "live": self.live_version, "examples": len(self.store.examples),
                "training_examples": self.store.n_training, "held_out": self.store.n_held_out,
                "new_since_training": self.store.new_training, "trainings": self.trained,
                "awaiting_text": len(self.awaiting),
                "training_now": self.training is not None,
                "verdicts": {k.value: v for k, v in self.store.counts.items()},
                "live_records": {m: r.summary() for m, r in self.live_records.items()}}

    def save_state(self, now_ms: int) -> None:
        try:
            self.r.set(Keys(self.s.redis.prefix).learn_state, json.dumps(self.state(now_ms)))
        except (redis.RedisError, OSError):
            metrics.REDIS_ERRORS.labels("trainer").inc()


def version_name(examples: Sequence[Example]) -> str:
    digest = hashlib.sha256("\n".join(sorted(e.request_id for e in examples)).encode()).hexdigest()
    return f"light-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{digest[:8]}"


def _put(cache: OrderedDict[str, Any], key: str, value: Any, cap: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > cap:
        cache.popitem(last=False)

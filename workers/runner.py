"""The worker loop: batch -> predict -> results / answers / escalations -> flush -> commit.

At-least-once: offsets are committed only after every produced record was acknowledged; a crash
re-processes at most the batch in flight (answer consumers dedupe by request id). With
`exactly_once` (Apache Kafka) outputs and offsets commit in one transaction instead.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import orjson
import redis
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from pipeline import metrics
from pipeline.adapters.batches import BatchCommitter
from pipeline.adapters.control_cache import ControlCache
from pipeline.adapters.conversations import Conversations
from pipeline.adapters.dlq import DeadLetters
from pipeline.adapters.doorbell import Bell, ring
from pipeline.adapters.heartbeats import RECENT_S, Heartbeat, LatencyWindow
from pipeline.adapters.kafka import (
    CRASH_MARK,
    DeliveryTracker,
    coordinates,
    lag_of,
    make_member,
    make_output_producer,
    produce,
    topics_of,
)
from pipeline.adapters.lanes import BackfillLane
from pipeline.adapters.probes import READINESS
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import ControlKeys, Keys
from pipeline.contracts.models import RoutedRequest, decode_model
from pipeline.contracts.records import (
    Answer,
    Context,
    Routed,
    Turn,
    answer,
    answer_draft,
    dump_answer_and_result,
    escalation,
    fast_routed,
    handover,
    result_details,
)
from pipeline.contracts.topics import Tier
from pipeline.core import conversation as conv
from pipeline.core.cascade import NEVER, Outcome, outcome, scope_score
from pipeline.errors import InvalidMessage
from pipeline.settings import Settings
from workers.batching import collect_batch
from workers.domains import AnswerBook, load_domain
from workers.model import InferenceModel, Item, Prediction, checked_predict
from workers.models.generator import GeneratedAnswers

log = logging.getLogger(__name__)


def transactional_id(settings: Settings, tier: Tier) -> str:
    """The stable name behind a tier worker's transactional ids: the same after a restart, so the new worker
    can abort what the dead one left open (a broker may never time it out: noida does not, and an open
    transaction holds back every read_committed consumer of its partitions).

    `worker_id` (TIERFLOW_WORKER_ID: set by `tierflow up` and --concurrency, or a StatefulSet pod name) tells
    apart several workers of a tier on one host; the default is the host name.
    """
    return settings.group(f"tx-{tier.value}-{settings.worker_id or socket.gethostname()}")


def take_transactional_id(r: redis.Redis, prefix: str, stable: str) -> tuple[str, str | None]:
    """(a fresh transactional id for this run, the one the previous run of `stable` used, to abort first).

    Reusing the previous id would abort its open transaction too, but keeps its producer id, and on noida a
    read_committed consumer that was waiting at the aborted transaction then drops that producer's next
    committed records as well (measured: tests/faults/test_exactly_once.py). A fresh id per run, with the
    previous one aborted by a producer of its own, is correct on every broker. Without Redis: the stable id.
    """
    key = Keys(prefix).transactional_id(stable)
    fresh = f"{stable}.{time.time_ns():x}"
    try:
        prev = r.get(key)
        r.set(key, fresh)
    except (redis.RedisError, OSError):
        log.warning("%s: Redis unavailable; reusing the transactional id %s", stable, stable)
        return stable, None
    return fresh, prev.decode() if isinstance(prev, bytes) else None


def abort_open_transaction(settings: Settings, tx_id: str, timeout_s: float = 30.0) -> None:
    """Fence `tx_id` and abort whatever transaction it left open: init_transactions() does both."""
    p = Producer({**settings.kafka_config(), "transactional.id": tx_id})
    p.init_transactions(timeout_s)
    p.flush(timeout_s)


@dataclass
class WorkerStats:
    batches: int = 0
    processed: int = 0
    answered: int = 0
    escalated: int = 0
    handed_over: int = 0
    dead: int = 0


def worker_id_of(tier: Tier) -> str:
    return f"{tier.value}-{socket.gethostname()}-{os.getpid()}"


def announce(settings: Settings, tier: Tier, worker_id: str, r: redis.Redis | None = None) -> Heartbeat:
    """Start this worker's heartbeat saying "starting" (`ready` false), before anything slow (importing torch,
    loading weights): ingest then knows a start-up is in progress and holds the tier's traffic for it instead of
    degrading it (pipeline/core/health.py). `Worker.run` takes the heartbeat over."""
    return Heartbeat(r or make_redis(settings), settings.redis.prefix, tier.value, worker_id,
                     settings.heartbeat.interval_s, settings.heartbeat.ttl_s,
                     lambda: {"tier": tier.value, "ready": False}).start()


class Worker:
    """One worker process of a tier. `run()` until `stop()`."""

    def __init__(self, settings: Settings, tier: Tier, model: InferenceModel, device: str = "cpu",
                 worker_id: str | None = None, r: redis.Redis | None = None,
                 announced: Heartbeat | None = None) -> None:
        """`announced`: the heartbeat that said this worker is starting (`announce`), taken over by `run()`."""
        self.s, self.tier, self.model, self.device = settings, tier, model, device
        self.topics = topics_of(settings)
        self.worker_id = worker_id or worker_id_of(tier)
        self.max_batch, self.max_wait_s = settings.batching(tier.value)
        self.adaptive_wait = settings.tier(tier.value).wait == "adaptive"
        self.r = r or make_redis(settings)
        self.group = settings.group(f"workers-{tier.value}")
        self.consumer = make_member(settings, self.group)
        self.consumer.listen(lambda: Bell(settings, [self.topics.tier(tier)]), rung=True)  # ingest (and light) ring it
        self.dlq = DeadLetters(settings, f"worker:{tier.value}")
        # Backfill: its own consumer, producer and batches, taken only while no live record waits. Its producer
        # writes answers and results: the output codec.
        tx_id = backfill_tx = None
        self._abort_first: list[str] = []  # transactional ids of the previous run, aborted in setup()
        if settings.exactly_once:
            stable = transactional_id(settings, tier)
            tx_id, prev = take_transactional_id(self.r, settings.redis.prefix, stable)
            backfill_tx, prev_backfill = take_transactional_id(self.r, settings.redis.prefix, f"{stable}-replay")
            self._abort_first = [t for t in (prev, prev_backfill) if t]
        self.backfill = BackfillLane(settings, settings.group(f"workers-{tier.value}-replay"),
                                     self.topics.replay_tier(tier), self.worker_id, self.dlq,
                                     backfill_tx, output=True)
        self.answered_key = Keys(settings.redis.prefix).replay_answered
        self.control = ControlCache.of(settings, self.r)  # to restore an empty Redis before a replay's SADD
        # One round trip and one call for a whole backfill batch: a pipelined SADD per id costs the client more.
        self._sadd_each = self.r.register_script(SADD_EACH)
        self.transactional = tx_id is not None
        extra = {"transactional.id": tx_id} if tx_id else {}
        self.delivery = DeliveryTracker()
        # Delivery reports for failures only: a Python callback per acknowledged record costs a microsecond.
        # It writes answers and results, which other programs read: the output codec.
        self.producer: Producer = make_output_producer(settings, on_delivery=self.delivery,
                                                **{"delivery.report.only.error": True}, **extra)
        self.committer = BatchCommitter(self.consumer, self.producer, self.delivery, self.dlq, self.worker_id,
                                        settings.flush_timeout_s, transactional=self.transactional)
        self.latency = LatencyWindow()
        # live answers only: what a replay must not slow down (2048: the recent p95 at a few thousand msg/s)
        self.live_latency = LatencyWindow(size=2048)
        self.stats = WorkerStats()
        self.lag = 0
        self.warm = False  # model loaded and warmed up (and transactions initialised)
        self.assigned = False  # in the group with partitions: before that, messages would wait on the join
        self._ready_wall = 0.0  # wall time it first became ready
        self.batch_at = "-"  # where the batch in hand starts: named if the process dies handling it
        self._busy_since: float | None = None  # monotonic start of the batch in hand, for the heartbeat
        # (kind, model, inference ms, queue ms, answered total ms) per item, counted once the batch is flushed
        self._observed: list[tuple[str, str, float, float, float | None]] = []
        self._abstained = self._handed_over = 0  # in the batch in hand, counted once it is flushed
        # the holding message of a request handed over to a person (the domain pack's, in the customer's language)
        self.book = load_domain(settings.domain).answers
        self.heartbeat: Heartbeat | None = announced
        self._stop = threading.Event()
        # Drafts of written answers (tierflow.answers.drafts): a producer of their own, outside the transactions,
        # made on the first draft: only a heavy worker with a streaming writer ever publishes one.
        self._drafts: Producer | None = None
        # Answered turns of customers' conversations, recorded once the batch is out (None: conversations off)
        self.conversations = Conversations(self.r, Keys(settings.redis.prefix), settings.conversation,
                                           f"worker:{tier.value}") if settings.conversation.enabled else None
        self._turns: list[tuple[str, str | None, Turn]] = []

    def stop(self) -> None:
        self._stop.set()

    def setup(self) -> None:
        t0 = time.perf_counter()
        self.model.setup(self.device)
        if isinstance(self.model, GeneratedAnswers):
            self.model.queue_probe = self._arrivals
        log.info("%s: %s ready on %s in %.1fs", self.worker_id, self.model.name, self.device,
                 time.perf_counter() - t0)
        if self.transactional:
            for old in self._abort_first:
                abort_open_transaction(self.s, old)
            self.producer.init_transactions(30)
        self.warm = True

    def readiness(self) -> dict[str, bool]:
        """What /ready and the heartbeat's `ready` say (pipeline/adapters/probes.py)."""
        return {"model_warm": self.warm, "partitions_assigned": self.assigned}

    @property
    def ready(self) -> bool:
        return all(self.readiness().values())

    def status(self) -> dict[str, Any]:
        recent_p95, recent_n = self.live_latency.recent_p95(RECENT_S)
        return {"lag": self.lag, "p95_ms": self.latency.p95(), "live_p95_ms": self.live_latency.p95(),
                "live_recent_p95_ms": recent_p95, "live_recent_n": recent_n, "busy_ms": self.busy_ms(),
                "processed": self.stats.processed, "model": self.model.name, "device": self.device,
                "tier": self.tier.value, "ready": self.ready}

    def busy_ms(self) -> float:
        """How long the batch in hand has taken so far, the writer's time apart (read by the heartbeat thread).

        The heavy tier's SLO judges this (pipeline/core/health.py); a writer answers to its own budget
        (`generator.timeout_s`), and a slow written reply goes out as the template, not as a degraded tier."""
        since = self._busy_since
        if since is None:
            return 0.0
        now = time.monotonic()
        writing = self.model.writing.seconds(now) if isinstance(self.model, GeneratedAnswers) else 0.0
        return round(max(0.0, now - since - writing) * 1000.0, 1)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not self.assigned:
            self._ready_wall = time.time()
        self.assigned = True

    def run(self) -> None:
        if self.heartbeat is None:  # not announced: say "starting" now, before the model loads
            self.heartbeat = announce(self.s, self.tier, self.worker_id, self.r)
        self.heartbeat.follow(self.status)
        READINESS.require(self.readiness)
        try:
            self.setup()
        except BaseException:
            READINESS.release(self.readiness)
            self.heartbeat.stop()
            raise
        self.consumer.subscribe([self.topics.tier(self.tier)], on_assign=self._on_assign)
        self.backfill.start()
        try:
            while not self._stop.is_set():
                self.step()
        except Exception:
            log.critical("%s: %s%s", self.worker_id, CRASH_MARK, self.batch_at)
            raise
        finally:
            READINESS.release(self.readiness)
            self.heartbeat.stop()
            self.producer.flush(self.s.flush_timeout_s)
            if self._drafts is not None:
                self._drafts.flush(self.s.flush_timeout_s)
            self.dlq.flush(self.s.flush_timeout_s)
            self.consumer.close()
            self.backfill.close()

    # --- one batch ---
    def step(self) -> int:
        """One live batch, or one backfill batch when no live record is buffered. Returns records processed.

        Live and replayed records never share a batch: a live record never waits for replayed ones'
        inference, flush or commit.
        """
        try:
            return self._step()
        finally:
            self._busy_since = None

    def _step(self) -> int:
        live = self.consumer.consume(self.max_batch, 0)
        if not live:
            n = self.backfill.turn(False, self._process_backfill)
            if n:
                return n
        live = collect_batch(self.consumer, self.max_batch, self.max_wait_s, self.backfill.idle_wait_s(0.1),
                             first=live, adaptive=self.adaptive_wait)
        if not live:
            self.lag = lag_of(self.consumer)
            return 0
        self.batch_at = coordinates(live)
        self.consumer.away()  # a model's batch can outlast a rest: no fetch loop meanwhile
        if self.transactional:
            self.producer.begin_transaction()
        self._process(live, self.producer)
        n = self._finish(live)
        # Due here only when live traffic has left no idle moment for a while: backfill still moves, slowly.
        return n + self.backfill.turn(True, self._process_backfill)

    def _process_backfill(self, msgs: list[Message], producer: Producer) -> None:
        self._process(msgs, producer)
        self._record_turns()  # before the lane commits: a batch read again records the same turns (upserts)
        self._count(len(msgs))  # counted when produced: a batch the broker refuses is counted again when re-read

    def _process(self, msgs: list[Message], producer: Producer) -> None:
        """Decode, predict and emit one batch to `producer` (flushing and committing are the caller's)."""
        if self._busy_since is None:
            if isinstance(self.model, GeneratedAnswers):
                self.model.writing.reset()  # before the batch's clock starts: busy_ms reads both
            self._busy_since = time.monotonic()
        dequeued = _now_ms()
        routed: list[tuple[Message, Routed, Item]] = []
        for msg in msgs:
            raw = msg.value()
            d = fast_routed(raw) if raw is not None else None
            if d is not None:
                routed.append((msg, d, Item(d["request"]["text"], d["features"]["lang"], None,
                                            received_ms=None if d["replay"] else d["received_ms"])))
                continue
            try:  # escalations, images, conversations, anything unusual: the full model, then the same plain dict
                rr = decode_model(RoutedRequest, raw)
                image = rr.request.image.decode() if rr.request.image is not None else None
                slow: Routed = rr.model_dump(mode="json", exclude_none=True)  # type: ignore[assignment]
                routed.append((msg, slow, item_of(rr.request.text or "", rr.features.lang, image, slow.get("context"),
                                                  None if rr.replay else rr.received_ms)))
            except InvalidMessage as e:
                self._dead(msg, e.kind, e.reason)
            except Exception as e:  # noqa: BLE001 - a bug met by one record must not stop the worker
                self._internal(msg, e)
        t0 = time.perf_counter()
        preds = self._predict(routed)
        injected = self.heartbeat.injected_latency_ms if self.heartbeat else 0.0
        if injected > 0 and routed:  # chaos: `tierflow fault latency` slows every batch of this tier
            time.sleep(injected / 1000.0)
        infer_ms = (time.perf_counter() - t0) * 1000.0
        per_item_ms = infer_ms / max(1, len(routed))
        inferred = _now_ms()
        self._observed = []
        self._abstained = self._handed_over = 0
        # A replayed id is claimed by the stage that answers it: light's claim would leave heavy, answering an
        # escalation, nothing to answer (the outcome does not depend on the claim, only whether it is answered).
        fresh = self._first_replay_answers([d for (_, d, _), p in zip(routed, preds, strict=True)
                                            if p is not None and d["replay"] and self._judge(d, p, None)[0].final])
        for (msg, d, item), pred in zip(routed, preds, strict=True):
            if pred is None:
                continue
            try:
                self._emit(producer, msg, d, item, pred, per_item_ms, len(routed), dequeued, inferred, fresh)
            except InvalidMessage as e:  # its outputs cannot be written (a huge key): the reason names the part
                self._dead(msg, e.kind, e.reason)
            except Exception as e:  # noqa: BLE001 - the last line of defence for one record
                self._internal(msg, e)

    def _first_replay_answers(self, batch: list[Routed]) -> set[str] | None:
        """Replayed ids that have not been answered by a replay before (None: Redis unavailable, answer all).

        Replaying the same range twice must not answer a request twice; `--force` overrides.
        """
        ids = [d["request"]["id"] for d in batch
               if d.get("replay") and not d.get("shadow") and not d.get("replay_force")]
        if not ids:
            return set()
        try:
            self.control.ensure_restored()  # an empty Redis first: its answered ids come back before this SADD
            added = self._sadd_each(keys=[self.answered_key], args=ids)
        except (redis.RedisError, OSError):
            metrics.REDIS_ERRORS.labels("worker").inc()
            return None
        return {rid for rid, n in zip(ids, added, strict=True) if n}

    def _predict(self, routed: list[tuple[Message, Routed, Item]]) -> list[Prediction | None]:
        """Predict the batch; on failure retry item by item and dead-letter what still fails."""
        if not routed:
            return []
        if len(routed) > self.max_batch:  # a backfill batch: the model still takes at most its max batch at once
            step = self.max_batch
            return [p for i in range(0, len(routed), step) for p in self._predict(routed[i:i + step])]
        items = [it for _, _, it in routed]
        self._drafting(routed)
        try:
            return list(predict_in_context(self.model, items, self.book))
        except Exception as e:  # noqa: BLE001 - any backend failure falls back to per-item retries
            log.warning("%s: batch of %d failed (%s); retrying item by item", self.worker_id, len(items), e)
        out: list[Prediction | None] = []
        for msg, _, item in routed:
            try:
                out.append(checked_predict(self.model, [item])[0])
            except InvalidMessage as e:
                self._dead(msg, e.kind, e.reason)
                out.append(None)
            except Exception as e:  # noqa: BLE001
                self._dead(msg, "model_error", f"{self.model.name}: {e.__class__.__name__}: {e}")
                out.append(None)
        return out

    def _drafting(self, routed: list[tuple[Message, Routed, Item]]) -> None:
        """Point the writer's drafts for this batch at tierflow.answers.drafts (live requests only: nobody waits on
        a replay's or a shadow's answer)."""
        model = self.model
        if not isinstance(model, GeneratedAnswers):
            return
        seqs: dict[int, int] = {}

        def publish(i: int, text: str) -> None:
            msg, d, _ = routed[i]
            if d["replay"] or d["shadow"]:
                return
            if self._drafts is None:
                self._drafts = make_output_producer(self.s, **{"linger.ms": 0})
            seq = seqs[i] = seqs.get(i, -1) + 1
            try:
                self._drafts.produce(self.topics.answer_drafts, orjson.dumps(answer_draft(d, seq, text, _now_ms())),
                                     msg.key())
                self._drafts.poll(0)
            except (BufferError, KafkaException) as e:  # best effort: the answer itself is what must arrive
                log.warning("%s: draft of %s not published (%s)", self.worker_id, d["request"]["id"], e)

        model.on_draft = publish

    def _judge(self, d: Routed, pred: Prediction, fresh: bool | None) -> tuple[Outcome, bool, str | None, float]:
        """A record's outcome at this stage (pipeline/core/cascade.py), with what it was decided from: whether the
        customer restated the open topic, the hand-over reason their conversation gives, the out-of-scope score."""
        esc = d.get("escalated_from")
        ctx = d.get("context")
        restated = not pred.context_used and conv.restated(ctx, pred.intent)  # its own reading, not the context's
        wanted = d.get("handover") or conv.handover_due(ctx, pred.intent)
        oos = scope_score(pred.oos, esc.get("oos_score") if esc is not None else None)
        fate = outcome(self.tier, pred.confidence, d["escalate_below"], shadow=d["shadow"], replay=d["replay"],
                       force=d.get("replay_force", False), degraded=d["degraded"], escalated=esc is not None,
                       fresh=fresh, oos_score=oos, abstain_above=d.get("abstain_above", NEVER),
                       handover_above=d.get("handover_above", NEVER), small_talk=pred.small_talk,
                       restated=restated, handover_wanted=wanted is not None)
        return fate, restated, wanted, oos

    def _emit(self, out: Producer, msg: Message, d: Routed, item: Item, pred: Prediction, infer_ms: float, batch: int,
              dequeued: int, inferred: int, fresh_replays: set[str] | None = None) -> None:
        """One record's outputs to `out` (the producer of the batch's lane): its result (always), then its answer
        or its escalation to heavy.

        `d` is a routed record as a plain dict (schemas/routed.v1.json, absent optionals omitted).
        """
        rid, key = d["request"]["id"], msg.key()
        replay = d["replay"]
        ctx = d.get("context")
        lang = d["features"]["lang"]
        used = pred.context_used
        fate, restated, wanted, oos = self._judge(d, pred, None if fresh_replays is None else rid in fresh_replays)
        escalate = fate.escalate
        produced = _now_ms()
        if escalate:
            text, fallback, handed = "", None, None
        elif fate.handover:  # a person answers: the customer is told so, in their language
            text, fallback, handed = self.book.holding(lang), None, wanted or HANDOVER_REASON
        else:
            text, fallback, handed = pred.answer, pred.fallback, None
            opening, slots_used = conv.used_slots(ctx, lang, text, item.message)
            text, used = opening + text, used + slots_used
        if fresh_replays and rid in fresh_replays:
            # what makes a resumed replay idempotent, durable beside the answer (same batch, same transaction):
            # a Redis that loses `replay:answered` is given it back from the control topic
            produce(out, self.topics.control, b"1", ControlKeys.replay_answered(rid))
        writer_wait = self._writer_wait(d, produced, pred.write_ms)
        ans = answer(d, self.tier, text, pred.intent, pred.confidence, pred.model, infer_ms, dequeued, produced,
                     fallback, handed, pred.write_ms, writer_wait)
        if ctx is not None:
            ans["context_used"] = [*used, *(("restated_topic",) if restated else ())]
            if fate.answer and self.conversations is not None:
                self._turns.append(self._answered_turn(d, ctx, item, ans, restated))
        answer_json, result_json = dump_answer_and_result(
            ans, result_details(d, self.tier, fate.final, dequeued, inferred, produced, batch, self.worker_id,
                                oos, fate.abstained))
        produce(out, self.topics.results, result_json, key)
        timings = ans["timings_ms"]
        # The tier's latency as its SLO sees it: the writer's time apart (it has its own budget; stats.Observed).
        self._observed.append((fate.kind, pred.model, infer_ms - pred.write_ms, timings["queue"],
                               max(0.0, float(timings["total"]) - pred.write_ms - writer_wait) if fate.answered
                               else None))
        if fate.abstained:
            self._abstained += 1
        if escalate:
            up = escalation(d, self.tier, pred.intent, pred.confidence, pred.model, infer_ms, oos, fate.abstained)
            heavy_topic = self.topics.replay_tier(Tier.HEAVY) if replay else self.topics.tier(Tier.HEAVY)
            try:
                produce(out, heavy_topic, orjson.dumps(up), key)
            except InvalidMessage as e:  # too big to forward (an image near the limit): dead-letter, say why
                self._dead(msg, e.kind, f"escalation to heavy failed: {e.reason}")
        elif fate.answer:
            produce(out, self.topics.answers, answer_json, key)
            if fate.handover:  # the desk's record goes in the same batch (and transaction) as the holding answer
                produce(out, self.topics.handover, orjson.dumps(handover(d, ans, oos)), key)
                self._handed_over += 1

    def _arrivals(self) -> Callable[[], int]:
        """From now, how many times records have reached this tier's live topic: its writers ring its doorbell and
        count the rings (`Keys.rung`; a ring per batch they wrote). Redis unavailable: 0 (the writer goes on)."""
        key = Keys(self.s.redis.prefix).rung(self.topics.tier(self.tier))

        def rung() -> int:
            try:
                return int(cast(bytes | None, self.r.get(key)) or 0)
            except (redis.RedisError, OSError, ValueError):
                return -1

        start = rung()
        return lambda: max(0, rung() - start) if start >= 0 else 0

    def _writer_wait(self, d: Routed, produced_ms: int, own_ms: float) -> float:
        """The writer's time on other requests' replies that a request waited through from its arrival to its
        answer: earlier batches' while it queued, its own batch's where its reply was not written (small talk), less
        `own_ms`, the writing of the batch it was attempted in (0 without a writer)."""
        if not isinstance(self.model, GeneratedAnswers):
            return 0.0
        return max(0.0, self.model.writing.overlap_ms(float(d["received_ms"]), float(produced_ms)) - own_ms)

    def _answered_turn(self, d: Routed, ctx: Context, item: Item, a: Answer,
                       restated: bool) -> tuple[str, str | None, Turn]:
        """The customer's turn with its answer, as the store keeps it (recorded once the batch is out)."""
        req = d["request"]
        turn = conv.new_turn(req["id"], ctx["conversation_id"], d["received_ms"], item.message, d["features"]["lang"],
                             d["features"]["complaint"])
        turn.update(conv.outcome(a["intent"], self.tier, a["answer"], restated or ctx["unresolved_marker"]))  # type: ignore[typeddict-item]
        return req.get("user_id") or "", d.get("replay_job") if d["replay"] else None, turn

    def _internal(self, msg: Message, e: Exception) -> None:
        """A record that raised in tierflow's own code: to the DLQ (kind internal) with the exception; go on."""
        log.exception("%s: %s[%s]@%s raised; dead-lettered", self.worker_id, msg.topic(), msg.partition(),
                      msg.offset())
        self._dead(msg, "internal", f"{type(e).__name__}: {e}")

    def _dead(self, msg: Message, kind: str, reason: str) -> None:
        self.dlq.send(msg, kind, reason)
        self.stats.dead += 1

    def _finish(self, live: list[Message]) -> int:
        """Flush and commit (or, with transactions, commit the transaction with the offsets)."""
        self.stats.batches += 1
        # Who to wake once the batch is out: the resting heavy workers for what it escalated, and the answers'
        # followers (`tierflow answers --follow`, a chat front end listening) for what it answered.
        wake = [self.topics.tier(Tier.HEAVY)] if any(kind == "escalated" for kind, *_ in self._observed) else []
        if any(answered is not None for *_, answered in self._observed):
            wake.append(self.topics.answers)
        if self._handed_over:
            wake.append(self.topics.handover)
        if not self.committer.finish(live):
            self._turns = []  # the batch is read again: its turns are recorded then
            return len(live)
        if wake:
            ring(self.r, self.s.redis.prefix, wake)
        self._record_turns()
        self._count(len(live))
        self.lag = lag_of(self.consumer)
        metrics.CONSUMER_LAG.labels(self.topics.tier(self.tier), self.group).set(self.lag)
        return len(live)

    def _record_turns(self) -> None:
        if self._turns and self.conversations is not None:
            self.conversations.complete(self._turns)
        self._turns = []

    def _count(self, batch: int) -> None:
        """Metrics and stats for a batch whose outputs the broker accepted (a rewound batch counts once).

        Grouped per model and observed once per batch: per-message labels()/observe() calls would cost
        more than the echo pipeline's whole per-message budget.
        """
        tier = self.tier.value
        metrics.BATCH_SIZE.labels(tier).observe(batch)
        infer: dict[str, list[float]] = {}
        e2e: dict[str, list[float]] = {}
        escalated: dict[str, int] = {}
        queue, answered, live = [], [], []
        # The health signal counts a request's wait from when this worker became ready at the latest: requests
        # queued while it started up were held for it on purpose (core/health.py), not slowed down by it.
        since_ready_ms = (time.time() - self._ready_wall) * 1000.0
        for kind, model, infer_ms, queue_ms, answered_ms in self._observed:
            infer.setdefault(model, []).append(infer_ms / 1000.0)
            queue.append(queue_ms / 1000.0)
            if kind == "escalated":
                escalated[model] = escalated.get(model, 0) + 1
            if answered_ms is not None:
                answered.append(answered_ms)
                if kind != "replay":
                    live.append(min(answered_ms, since_ready_ms))
                e2e.setdefault(model, []).append(answered_ms / 1000.0)
        for model, xs in infer.items():
            metrics.observe_many(metrics.INFERENCE_SECONDS.labels(tier, model), xs)
        metrics.observe_many(metrics.QUEUE_SECONDS.labels(tier), queue)
        for model, xs in e2e.items():
            metrics.observe_many(metrics.END_TO_END_SECONDS.labels(tier, model), xs)
            metrics.ANSWERS.labels(tier, model).inc(len(xs))
        for model, n in escalated.items():
            metrics.ESCALATED.labels(model).inc(n)
        if self._abstained:
            metrics.ABSTAINED.labels(tier).inc(self._abstained)
        if self._handed_over:
            metrics.HANDOVERS.labels(tier, HANDOVER_REASON).inc(self._handed_over)
        self.stats.handed_over += self._handed_over
        self._abstained = self._handed_over = 0
        self.latency.extend(answered)
        self.live_latency.extend(live)
        self.stats.processed += len(self._observed)
        self.stats.escalated += sum(escalated.values())
        self.stats.answered += len(answered)
        self._observed = []


# SADD per member, answering 1 for each member that was new: which replayed ids this batch answers first.
SADD_EACH = "local out = {} for i, m in ipairs(ARGV) do out[i] = redis.call('SADD', KEYS[1], m) end return out"


HANDOVER_REASON = "out_of_scope"  # the final stage's out-of-scope score was over `handover_above`


def predict_in_context(model: InferenceModel, items: list[Item], book: AnswerBook) -> list[Prediction]:
    """`model`'s predictions with each customer's conversation read in (pipeline/core/conversation.py `choose`).

    A message after others is also read with its conversation's earlier turns: one more row in the same classifier
    call. A writer writes once per message, on the reading chosen: its classifier reads both first.
    """
    alts = {i: j for i, it in enumerate(items)
            if it.context is not None and (j := conv.joined_text(it.context, it.text))}
    if not alts:
        return checked_predict(model, items)
    reader: InferenceModel | None = getattr(model, "classifier", None)  # the classifier under a writer
    first = checked_predict(reader or model, [*items, *(Item(j, items[i].lang) for i, j in alts.items())])
    joined = dict(zip(alts, first[len(items):], strict=True))
    readings = {i: conv.choose(items[i].context, _guess(first[i]), _guess(joined[i]), items[i].text) for i in alts}
    if reader is None:
        return [_as_read(joined[i] if i in readings and readings[i].source == "joined" else p, readings.get(i),
                         items[i], book) for i, p in enumerate(first[:len(items)])]
    chosen = [replace(it, text=alts[i], said=it.text) if i in readings and readings[i].source != "own" else it
              for i, it in enumerate(items)]
    return [_as_read(p, readings.get(i), chosen[i], book) for i, p in enumerate(checked_predict(model, chosen))]


def _guess(p: Prediction) -> conv.Guess:
    return conv.Guess(p.intent, p.confidence, p.small_talk)


def _as_read(p: Prediction, reading: conv.Reading | None, item: Item, book: AnswerBook) -> Prediction:
    if reading is None or reading.source == "own":
        return p
    if reading.intent != p.intent:  # the open topic's answer, not a pleasantry or the fragment's guess
        return replace(p, intent=reading.intent, answer=book.answer(reading.intent, item.lang), small_talk=False,
                       oos=0.0, context_used=reading.used)
    return replace(p, context_used=reading.used)


def item_of(text: str, lang: str, image: bytes | None, ctx: Context | None,
            received_ms: int | None = None) -> Item:
    """A routed message as its model reads it, with its conversation (and, live, when tierflow received it)."""
    return Item(text, lang, image, ctx, received_ms=received_ms)


def _now_ms() -> int:
    return int(time.time() * 1000)

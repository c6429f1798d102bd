"""The ingest agent: requests -> validate -> features -> route -> tier topic | DLQ.

One synchronous confluent-kafka loop per process (scale by partitions). Offsets are committed only
after every record produced for a batch was acknowledged, so a crash re-reads rather than loses.
The routed record embeds the request's original JSON bytes (already validated) instead of
re-serialising it: that keeps the per-message cost to parsing, features and one small dumps.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline import metrics
from pipeline.adapters.batches import BatchCommitter
from pipeline.adapters.conversations import Conversations, Pending
from pipeline.adapters.conversations import Message as Said
from pipeline.adapters.dlq import DeadLetters, headers_dict
from pipeline.adapters.doorbell import Bell, ring
from pipeline.adapters.heartbeats import AGENT, Heartbeat, observe
from pipeline.adapters.kafka import (
    CRASH_MARK,
    DeliveryTracker,
    coordinates,
    lag_of,
    make_member,
    make_producer,
    poll_batch,
    produce,
    topics_of,
)
from pipeline.adapters.lanes import BackfillLane
from pipeline.adapters.periodic import Periodic
from pipeline.adapters.probes import READINESS
from pipeline.adapters.redis_client import make_redis
from pipeline.adapters.threshold_store import ThresholdCache, ThresholdStore
from pipeline.contracts.keys import Keys
from pipeline.contracts.models import decode_request
from pipeline.contracts.records import (
    MAX_IMAGE_BYTES,
    Context,
    Features,
    RequestRecord,
    RoutedBatch,
    RoutedFields,
    dump_routed,
    fast_request,
    replayed,
    routed_fields,
    with_context,
)
from pipeline.contracts.topics import Tier
from pipeline.core import conversation as conv
from pipeline.core import features
from pipeline.core.health import HealthState, assess, at_own_start, heavy_limits
from pipeline.core.routing import HEALTHY, Route, TierHealth, in_sample, route
from pipeline.core.thresholds import Thresholds
from pipeline.errors import InvalidMessage, InvalidThresholds
from pipeline.settings import Settings

log = logging.getLogger(__name__)

_IMAGE_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/webp": (b"RIFF",),
}


def check_image(data: bytes, mime: str) -> None:
    """Cheap checks at the edge: size and magic bytes. Full decoding (pixel limits) is the worker's."""
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidMessage("oversize", f"image is {len(data)} bytes decoded, limit {MAX_IMAGE_BYTES}")
    if not data.startswith(_IMAGE_MAGIC[mime]) or (mime == "image/webp" and data[8:12] != b"WEBP"):
        raise InvalidMessage("bad_image", f"image.data is not a {mime} image")


class HealthMonitor:
    """Ingest's view of the heavy tier, from heavy workers' heartbeats, refreshed in the background.

    `startup_s` and `announce_s`: `settings.heartbeat` (a start-up in progress is not a breach: core/health.py).
    """

    def __init__(self, r: redis.Redis, prefix: str, cache: ThresholdCache, startup_s: float, announce_s: float,
                 interval_s: float = 0.25) -> None:
        self.r, self.prefix, self.cache, self.interval_s = r, prefix, cache, interval_s
        self.startup_s, self.announce_s = startup_s, announce_s
        self.state = HealthState(HEALTHY)
        self.checked = False  # one observation made: until then the verdict is the optimistic default
        self._t0 = time.monotonic()
        self._thread = Periodic("health", interval_s, self.check)

    @property
    def health(self) -> TierHealth:
        return self.state.health

    def start(self) -> HealthMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.close()

    def check(self) -> None:
        th = self.cache.current
        try:
            obs = observe(self.r, self.prefix, Tier.HEAVY)
        except (redis.RedisError, OSError):
            return  # no news is no change: keep the last verdict while Redis is away
        now = time.monotonic()
        obs = at_own_start(obs, now - self._t0, self.announce_s)
        new = assess(self.state, obs, heavy_limits(th, self.startup_s), now)
        self.checked = True
        if new.health != self.state.health:
            log.warning("heavy tier %s (workers=%d lag=%d p95=%.0fms)",
                        "healthy again" if new.health.heavy_ok else f"unhealthy: {new.health.reason}",
                        obs.workers, obs.lag, obs.p95_ms)
        self.state = new
        metrics.HEAVY_HEALTHY.set(1 if new.health.heavy_ok else 0)


@dataclass
class IngestStats:
    consumed: int = 0
    routed: int = 0
    dead: int = 0


class Ingest:
    """The ingest loop. `run()` until `stop()`; `step()` processes one consumed batch."""

    def __init__(self, settings: Settings, r: redis.Redis | None = None, health_checks: bool = True) -> None:
        self.s = settings
        self.topics = topics_of(settings)
        self.r = r or make_redis(settings)
        self.store = ThresholdStore.of(settings, self.r)
        self.cache = ThresholdCache(self.store, component="ingest")
        self.monitor = HealthMonitor(self.r, settings.redis.prefix, self.cache,
                                     startup_s=settings.heartbeat.startup_s,
                                     announce_s=settings.heartbeat.announce_s) if health_checks else None
        self.consumer = make_member(settings, settings.group("ingest"))
        self.consumer.listen(lambda: Bell(settings, [self.topics.requests]))  # `tierflow send` rings it
        self.dlq = DeadLetters(settings, "ingest")
        # Backfill has its own topic, group, producer and batches, taken only while no live record waits.
        self.backfill = BackfillLane(settings, settings.group("ingest-replay"), self.topics.replay, "ingest",
                                     dlq=self.dlq)
        self._pinned: dict[int, Thresholds] = {}
        self.delivery = DeliveryTracker()
        # Delivery reports for failures only: a Python callback per acknowledged record costs a microsecond.
        self.producer = make_producer(settings, on_delivery=self.delivery, **{"delivery.report.only.error": True})
        self.committer = BatchCommitter(self.consumer, self.producer, self.delivery, self.dlq, "ingest",
                                        settings.flush_timeout_s)
        self.stats = IngestStats()
        self.assigned = False  # partitions assigned: a request sent now is routed without waiting for a join
        self.batch_at = "-"  # where the batch in hand starts: named if the process dies handling it
        self.heartbeat = Heartbeat(self.r, settings.redis.prefix, AGENT, f"ingest-{socket.gethostname()}-{os.getpid()}",
                                   settings.heartbeat.interval_s, settings.heartbeat.ttl_s, self.status)
        self._stop = threading.Event()
        # Each customer's earlier turns (None: every message stands alone)
        self.conversations = Conversations(self.r, Keys(settings.redis.prefix), settings.conversation, "ingest") \
            if settings.conversation.enabled else None
        self._sources = [self.topics.requests]
        self._tier_topics = {t: self.topics.tier(t) for t in Tier}
        self._replay_topics = {t: self.topics.replay_tier(t) for t in Tier}

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict[str, object]:
        return {"agent": "ingest", "ready": self.ready, "consumed": self.stats.consumed}

    def readiness(self) -> dict[str, bool]:
        """What /ready and the heartbeat's `ready` say: thresholds read from Redis, heavy's health known,
        partitions assigned (pipeline/adapters/probes.py)."""
        checks = {"thresholds_loaded": self.cache.loaded.is_set(), "partitions_assigned": self.assigned}
        if self.monitor is not None:
            checks["heavy_health_known"] = self.monitor.checked
        return checks

    @property
    def ready(self) -> bool:
        return all(self.readiness().values())

    def run(self) -> None:
        READINESS.require(self.readiness)
        self.cache.start()
        if self.monitor:
            self.monitor.start()
        self.heartbeat.start()
        self.consumer.subscribe(self._sources, on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.backfill.start()
        log.info("ingest: consuming %s (thresholds v%d%s)", ", ".join(self._sources), self.cache.current.version,
                 ", Redis unavailable: defaults" if self.cache.stale else "")
        try:
            while not self._stop.is_set():
                self.step(timeout=0.1)
        except Exception:
            log.critical("ingest: %s%s", CRASH_MARK, self.batch_at)
            raise
        finally:
            self.close()

    def close(self) -> None:
        READINESS.release(self.readiness)
        self.heartbeat.stop()
        self.cache.stop()
        if self.monitor:
            self.monitor.stop()
        self.producer.flush(self.s.flush_timeout_s)
        self.dlq.flush(self.s.flush_timeout_s)
        self.consumer.close()
        self.backfill.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = True

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Everything consumed so far was flushed and committed inside step(); nothing to do but note it.
        log.debug("ingest: partitions revoked: %s", partitions)

    def step(self, timeout: float = 0.1) -> int:
        """Consume one live batch, route it, flush, commit. Returns the number of live records consumed.

        Backfill records are routed in batches of their own, only while no live record is buffered.
        """
        msgs = self.consumer.consume(self.s.ingest.batch, 0)
        if not msgs:
            if self.backfill.turn(False, self._route_backfill):
                return 0
            msgs = poll_batch(self.consumer, self.s.ingest.batch, self.backfill.idle_wait_s(timeout))
            if not msgs:
                return 0
        n = self._step_live(msgs)
        # Due here only when live traffic has left no idle moment for a while: backfill still moves, slowly.
        self.backfill.turn(True, self._route_backfill)
        return n

    def _route_backfill(self, msgs: list[Message], producer: Producer) -> None:
        """A batch from the backfill topic to the backfill tier topics (BackfillLane flushes and commits)."""
        health = self.monitor.health if self.monitor else HEALTHY
        now_ms = int(time.time() * 1000)
        routed: Counter[Route] = Counter()
        for msg in msgs:
            try:
                self._route_replay(msg, health, now_ms, routed)
            except Exception as e:  # noqa: BLE001 - as in the live loop: one record never stops the lane
                self._internal(msg, e)
        metrics.REQUESTS_IN.labels("replay").inc(len(msgs))
        _count_routes(routed)

    def _step_live(self, msgs: list[Message]) -> int:
        self.batch_at = coordinates(msgs)
        self.consumer.away()  # routing, flushing and committing outlast a sparse rest: no fetch loop meanwhile
        t0 = time.perf_counter()
        th = self.cache.current
        health = self.monitor.health if self.monitor else HEALTHY
        now_ms = int(time.time() * 1000)
        routed: Counter[Route] = Counter()
        good = self._route_live(msgs, th, health, now_ms, routed)
        if not self.committer.finish(good):
            return len(msgs)
        # The records are in the tier topics: wake their resting workers now rather than at their next look.
        ring(self.r, self.s.redis.prefix, {self._tier_topics[r.tier] for r in routed})
        # Metrics per batch, not per message: a labelled inc() costs as much as routing a message.
        metrics.REQUESTS_IN.labels("live").inc(len(good))
        _count_routes(routed)
        metrics.ROUTE_SECONDS.observe(time.perf_counter() - t0)
        metrics.CONSUMER_LAG.labels(self.topics.requests, self.s.group("ingest")).set(lag_of(self.consumer))
        self.stats.consumed += len(good)
        return len(msgs)

    def _route_live(self, msgs: list[Message], th: Thresholds, health: TierHealth, now_ms: int,
                    routed: Counter[Route]) -> list[Message]:
        """The hot loop: plain text requests inline, everything rarer through `_route_one`."""
        errors = 0
        env = _Envelope(th, now_ms, self._tier_topics)
        talks = self.conversations is not None
        in_context: list[tuple[Message, RequestRecord, Features, Route, int]] = []  # customers' messages
        vips, length, fast_ok = self.cache.vips, th.length_threshold, th.shadow_rate <= 0
        extract, features_json, dests, produce_ = features.extract_fields, RoutedBatch.features, env.dests, \
            self.producer.produce
        dump = env.batch.dump
        for msg in msgs:
            if msg.error() is not None:
                errors += 1
                self._consume_error(msg)
                continue
            try:  # zero-cost while nothing raises: the last line of defence for one record
                raw = msg.value()
                d = fast_request(raw) if raw is not None and fast_ok else None
                if raw is None or d is None:
                    self._route_one(msg, th, health, now_ms, routed)
                    continue
                user_id = d.get("user_id")
                feats = extract(d["text"], d.get("lang"), False, 0, user_id in vips)
                r = route(feats, length, health)
                ts_type, ts = msg.timestamp()
                received = ts if ts_type and ts > 0 else (d.get("ts") or now_ms)
                if talks and user_id is not None:  # routed below, in its conversation, with the batch's others
                    in_context.append((msg, d, feats, r, received))
                    continue
                topic, route_json = dests.get(r) or env.dest(r)
                value = dump(raw, features_json(feats), received, route_json)
                key = msg.key() or (user_id or d["id"]).encode()
                try:
                    produce_(topic, value, key)
                except (BufferError, KafkaException):
                    if not self._produce_slow(msg, topic, value, key):
                        continue
                routed[r] += 1
            except Exception as e:  # noqa: BLE001 - a bug met by one record must not stop the pipeline
                self._internal(msg, e)
        if in_context:
            self._route_in_context(in_context, env, health, now_ms, routed)
        self.stats.routed += sum(routed.values())
        return [m for m in msgs if m.error() is None] if errors else msgs

    def _route_in_context(self, batch: list[tuple[Message, RequestRecord, Features, Route, int]], env: _Envelope,
                          health: TierHealth, now_ms: int, routed: Counter[Route]) -> None:
        """Customers' plain messages: placed in their conversations (one read and one write for the batch), then
        routed as their conversation says (pipeline/core/conversation.py)."""
        assert self.conversations is not None
        pending = Pending()
        try:
            ctxs, pending = self.conversations.place(
                [Said(d["user_id"], d["id"], received, d["text"], f["lang"], f["complaint"])
                 for _, d, f, _, received in batch], now_ms)
        except Exception as e:  # a bug in the store must not lose the batch: route it without context
            log.exception("ingest: conversations failed (%s); routing the batch without them", e)
            ctxs = [None] * len(batch)
        for (msg, d, feats, r, received), ctx in zip(batch, ctxs, strict=True):
            try:
                steer = conv.steer(r, ctx, feats["complaint"], health)
                topic, route_json = env.dests.get(steer.route) or env.dest(steer.route)
                value = with_context(env.batch.dump(msg.value() or b"{}", RoutedBatch.features(feats), received,
                                                    route_json), ctx, steer.handover)
                key = msg.key() or d["user_id"].encode()
                try:
                    self.producer.produce(topic, value, key)
                except (BufferError, KafkaException):
                    if not self._produce_slow(msg, topic, value, key):
                        continue
                routed[steer.route] += 1
            except Exception as e:  # noqa: BLE001 - a bug met by one record must not stop the pipeline
                self._internal(msg, e)
        # The new turns are written while the routed records travel (their workers do not wait on it), and before
        # the next batch is read (a customer's next message sees this one).
        self.conversations.save(pending)

    def _context(self, user_id: str | None, request_id: str, at_ms: int, text: str, feats: Features,
                 conversation_id: str | None, replay_job: str | None) -> Context | None:
        """One message's conversation (the slow path's: images, validated requests, replays)."""
        if self.conversations is None or user_id is None:
            return None
        return self.conversations.contexts([Said(user_id, request_id, at_ms, text, feats["lang"], feats["complaint"],
                                                 conversation_id, replay_job)], at_ms)[0]

    def _internal(self, msg: Message, e: Exception) -> None:
        """A record that raised in tierflow's own code: to the DLQ (kind internal) with the exception; go on."""
        log.exception("ingest: %s[%s]@%s raised; dead-lettered", msg.topic(), msg.partition(), msg.offset())
        self.dlq.send(msg, "internal", f"{type(e).__name__}: {e}")
        self.stats.dead += 1

    def _consume_error(self, msg: Message) -> None:
        err = msg.error()
        if err is not None and err.code() != KafkaError._PARTITION_EOF:
            metrics.BROKER_ERRORS.labels("ingest", err.name()).inc()
            log.warning("ingest: consume error: %s", err)

    def _produce_slow(self, msg: Message, topic: str, value: bytes, key: bytes) -> bool:
        """produce() when the fast call failed: wait out a full queue; a record too big goes to the DLQ."""
        try:
            produce(self.producer, topic, value, key)
            return True
        except InvalidMessage as e:
            # A valid request whose routed record cannot be written (an image near the limit, a huge key).
            self.dlq.send(msg, "oversize", e.reason)
            self.stats.dead += 1
            return False

    def _route_replay(self, msg: Message, health: TierHealth, now_ms: int, routed: Counter[Route]) -> None:
        """A backfill record: marked replay, optionally under pinned thresholds, optionally shadow-only."""
        h = headers_dict(msg)
        th = self.cache.current
        pin = h.get("x-pin-thresholds")
        if pin:
            th = self._pinned_thresholds(int(pin)) or th
        sent = h.get("x-sent-ms", "")
        self._route_one(msg, th, health, now_ms, routed, replay_job=h.get("x-replay-job", "replay"),
                        shadow=h.get("x-shadow") == "1", force=h.get("x-force") == "1",
                        sent_ms=int(sent) if sent.isdigit() else None)

    def _pinned_thresholds(self, version: int) -> Thresholds | None:
        if version not in self._pinned:
            try:
                self._pinned[version] = self.store.version(version)
            except (redis.RedisError, OSError, InvalidThresholds) as e:
                log.warning("ingest: thresholds v%d unavailable (%s); replaying under the current ones", version, e)
                return None
        return self._pinned[version]

    def _route_one(self, msg: Message, th: Thresholds, health: TierHealth, now_ms: int,
                   routed: Counter[Route], replay_job: str | None = None, shadow: bool = False,
                   force: bool = False, sent_ms: int | None = None) -> None:
        """Any request: images, full validation with a DLQ reason, shadow sampling, backfill."""
        raw = msg.value()
        image_bytes = 0
        try:
            req = decode_request(raw, self.s.max_message_bytes)
            if req.image is not None:
                data = req.image.decode()
                check_image(data, req.image.mime)
                image_bytes = len(data)
        except InvalidMessage as e:
            self.dlq.send(msg, e.kind, e.reason, "ingest" if replay_job is None else "ingest:replay")
            self.stats.dead += 1
            return
        feats = features.extract(req, vip=req.user_id in self.cache.vips, image_bytes=image_bytes)
        r = route(feats, th.length_threshold, health)
        ts_type, ts = msg.timestamp()
        received = ts if ts_type != 0 and ts > 0 else (req.ts or now_ms)
        said_at = received
        if replay_job is not None:
            received = now_ms  # a backfill's latency starts when it is replayed, not when first sent
            # its conversations as they were: a turn sits where it was first sent, so idle gaps still split them
            said_at = sent_ms or req.ts or now_ms
        key = msg.key() or (req.user_id or req.id).encode()
        ctx = self._context(req.user_id, req.id, said_at, req.text or "", feats, req.conversation_id, replay_job)
        steer = conv.steer(r, ctx, feats["complaint"], health)
        r = steer.route
        fields = routed_fields(feats, r.tier, r.reason, r.degraded, th.version, th.escalate_below, received, now_ms,
                               th.abstain_above, th.handover_above)
        if ctx is not None:
            fields["context"] = ctx
            if steer.handover is not None:
                fields["handover"] = steer.handover
        raw_request = raw or b"{}"
        if replay_job is not None:
            try:
                self._send_replay(raw_request, replayed(fields, replay_job, force), r, key, shadow)
            except InvalidMessage as e:
                self.dlq.send(msg, e.kind, e.reason, "ingest:replay")
                self.stats.dead += 1
                return
            routed[REPLAY_ROUTES[r.tier]] += 1
            return
        value = dump_routed(raw_request, fields)
        if not self._produce_slow(msg, self._tier_topics[r.tier], value, key):
            return
        routed[r] += 1
        if r.tier is Tier.LIGHT and not r.degraded and th.shadow_rate > 0 and in_sample(req.id, th.shadow_rate):
            fields["shadow"], fields["tier"], fields["route_reason"] = True, Tier.HEAVY, "shadow"
            produce(self.producer, self.topics.tier(Tier.HEAVY), dump_routed(raw_request, fields), key)
            metrics.SHADOWED.inc()
        self.stats.routed += 1

    def _send_replay(self, raw: bytes, fields: RoutedFields, r: Route, key: bytes, shadow: bool) -> None:
        """To the backfill tier topics; `shadow` runs both light and heavy and answers nobody.

        A record too big to write raises InvalidMessage (produce() names the part that is too big)."""
        if shadow:
            for tier in (Tier.LIGHT, Tier.HEAVY):
                fields["tier"], fields["shadow"], fields["route_reason"] = tier, True, f"replay_shadow:{r.reason}"
                produce(self.backfill.producer, self._replay_topics[tier], dump_routed(raw, fields), key)
        else:
            produce(self.backfill.producer, self._replay_topics[r.tier], dump_routed(raw, fields), key)
        self.stats.routed += 1


REPLAY_ROUTES = {t: Route(t, "replay") for t in Tier}


class _Envelope:
    """One live batch's routed records (records.RoutedBatch) and, per route, its topic and serialised fields."""

    def __init__(self, th: Thresholds, now_ms: int, topics: dict[Tier, str]) -> None:
        self.batch = RoutedBatch(th.version, th.escalate_below, now_ms, th.abstain_above, th.handover_above)
        self.topics = topics
        # Per route: its topic and its JSON fields. Keyed by the shared Route instance (identity hash).
        self.dests: dict[Route, tuple[str, bytes]] = {}

    def dest(self, r: Route) -> tuple[str, bytes]:
        self.dests[r] = (self.topics[r.tier], RoutedBatch.route(r.tier, r.reason, r.degraded))
        return self.dests[r]


def _count_routes(routed: Counter[Route]) -> None:
    """Routing metrics for one batch: per route, not per message (a labelled inc() costs as much as routing)."""
    for r, n in routed.items():
        metrics.ROUTED.labels(r.tier, r.reason).inc(n)
        if r.degraded:
            metrics.DEGRADED.labels(r.reason).inc(n)

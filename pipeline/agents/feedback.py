"""The feedback agent: results and labels -> windowed statistics -> controller -> thresholds in Redis.

A faust-streaming app (web server off) reads `tierflow.results` and `tierflow.labels` in batches
(`stream.take_events(max_, within)`), feeds `pipeline.core.stats.Aggregator` (windows per tier and per
model, label and shadow joins) and, every `interval_s`, runs `pipeline.core.controller.decide` and writes
its changes with `ThresholdStore.update(..., respect_pins=True)`, reason and inputs included, or rolls
a bad change back. It publishes the model scores, accuracy, heavy share, hand-over share and tier p95 metrics.

Durable state lives in Redis, not in faust tables (tansu's changelog recovery lost updates): every
interval the whole state (windows, last-N per model, pending joins, the change under observation,
the last offset per partition) is written as one JSON snapshot to `<redis_prefix>feedback:state`,
and only then are the consumer offsets committed. On start the snapshot is restored and records at
or below its offsets are skipped, so a restart neither loses nor double-counts what was snapshotted.
A Redis outage is survived: statistics keep accumulating, control and snapshots pause (offsets are
not committed meanwhile) and resume when Redis answers again; a snapshot that could not be read at
start is merged in once it can.

Run one feedback agent per pipeline (`tierflow feedback`): it is the single writer of the controller's
thresholds. Its knobs are `settings.feedback` (`pipeline.settings.FeedbackSection`, `TIERFLOW_FEEDBACK_*`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import faust
import orjson
import redis
from faust.transport.drivers import aiokafka as faust_aiokafka

from pipeline import metrics
from pipeline.adapters.heartbeats import AGENT, Heartbeat, observe
from pipeline.adapters.kafka import check_reachable
from pipeline.adapters.probes import READINESS
from pipeline.adapters.redis_client import make_redis
from pipeline.adapters.threshold_store import ThresholdStore
from pipeline.contracts.keys import Keys
from pipeline.contracts.records import result_of
from pipeline.contracts.topics import Topics
from pipeline.core.controller import (
    TUNED,
    ControllerConfig,
    ControllerState,
    Decision,
    applied,
    decide,
    rank_models,
    score_of,
)
from pipeline.core.health import Observation
from pipeline.core.stats import AfterChange, AggConfig, Aggregator, WindowStats
from pipeline.core.thresholds import Thresholds
from pipeline.errors import InvalidThresholds
from pipeline.settings import FeedbackSection, Settings

log = logging.getLogger("pipeline.agents.feedback")  # also when run as __main__

WHO = "feedback"


def agg_config(fb: FeedbackSection) -> AggConfig:
    """The windows and joins of the statistics, from the agent's settings."""
    return AggConfig(window_ms=int(fb.window_s * 1000), hop_ms=int(min(fb.hop_s, fb.window_s) * 1000),
                     max_window_ms=int(max(fb.max_window_s, fb.window_s) * 1000),
                     last_n=fb.last_n, label_ttl_ms=int(fb.label_ttl_s * 1000),
                     shadow_ttl_ms=int(fb.shadow_ttl_s * 1000), max_pending=fb.max_pending)


def controller_config(fb: FeedbackSection, startup_s: float) -> ControllerConfig:
    """The controller's knobs, from the agent's settings (the rollback watch defaults to two windows);
    `startup_s`: `settings.heartbeat.startup_s`."""
    # the hand-over share rests on as many answers as the heavy share: the window widens until it has them
    return ControllerConfig(min_results=fb.min_results, min_oos_scores=fb.min_results, deadband=fb.deadband,
                            shed_cooldown_s=fb.window_s,
                            observe_s=fb.observe_s if fb.observe_s is not None else 2 * fb.window_s,
                            startup_s=startup_s)


def group_of(settings: Settings) -> str:
    return settings.feedback.group or f"{settings.topic.prefix.rstrip('.:')}-feedback"


# --------------------------------------------------------------------------- the agent's state and I/O
@dataclass(frozen=True, slots=True)
class TickResult:
    """What one control tick did (for logs and tests)."""

    decision: Decision | None
    written: Thresholds | None
    error: str | None = None


class Feedback:
    """The agent without faust: feed batches, `tick()` every interval. Redis I/O is in `*_io` methods."""

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.s = settings
        self.cfg = settings.feedback
        self.topics = Topics(settings.topic.prefix)
        self.r = client or make_redis(settings)
        self.store = ThresholdStore.of(settings, self.r)
        self.state_key = Keys(settings.redis.prefix).feedback_state
        self.agg = Aggregator(agg_config(self.cfg))
        self.ctl_cfg = controller_config(self.cfg, settings.heartbeat.startup_s)
        self.state = ControllerState()
        self.replays_ignored = 0  # replayed results seen and left out of the statistics
        self.restored = False
        self.thresholds: Thresholds | None = None
        self.last: TickResult | None = None
        self.redis_ok = True
        self.ticks = 0  # control ticks run: the first one means the agent consumes and controls (ready)
        self._last_warn = 0.0

    # --- records (event loop; no I/O) ---
    def add(self, topic: str, partition: int, offset: int | None, value: bytes | None, now_ms: int,
            ts_ms: int = 0) -> None:
        """One record of the results or labels topic (`ts_ms`: its Kafka timestamp)."""
        if offset is not None and not self.agg.fresh(f"{topic}:{partition}", offset, ts_ms):
            return  # processed before the snapshot we restored
        if value is None:
            self.agg.invalid += 1
            return
        if topic == self.topics.results:
            res = result_of(value)
            if res is None:
                self.agg.invalid += 1
            elif res.get("replay"):
                # The controller steers live traffic: a backfill's answers wait behind its duty cycle (minutes
                # of "latency" on an idle stack) and may route under pinned thresholds.
                self.replays_ignored += 1
            else:
                self.agg.add_result(res, now_ms)
            return
        try:
            rec = orjson.loads(value)
        except orjson.JSONDecodeError:
            self.agg.invalid += 1
            return
        if not isinstance(rec, dict):
            self.agg.invalid += 1
        else:
            self.agg.add_label(rec, now_ms)

    # --- snapshots ---
    def snapshot(self, now_ms: int) -> bytes:
        return orjson.dumps({"saved_at": now_ms, "agg": self.agg.to_json(), "controller": self.state.to_json()})

    def load(self, raw: bytes | str) -> None:
        """Restore (or merge, when records were already counted) a snapshot."""
        data = orjson.loads(raw)
        old = Aggregator.from_json(data["agg"], agg_config(self.cfg))
        if self.agg.observed == 0 and not self.agg.offsets:
            self.agg = old
        else:
            self.agg.merge(old)
        if self.state == ControllerState():
            self.state = ControllerState.from_json(data["controller"])
        log.info("feedback: restored state saved %.1fs ago: %d results so far, %d buckets, %d pending label joins, "
                 "change under watch: %s", (time.time() * 1000 - data["saved_at"]) / 1000, self.agg.observed,
                 len(self.agg.buckets), len(self.agg.awaiting),
                 f"v{self.state.pending.version}" if self.state.pending else "none")

    def read_io(self) -> tuple[bool, bytes | str | None]:
        """(Redis answered, the snapshot or None) - blocking."""
        try:
            return True, self.r.get(self.state_key)
        except (redis.RedisError, OSError) as e:
            self._redis_down(e, "restore")
            return False, None

    def restore(self, raw: bytes | str | None) -> None:
        """Take the snapshot read by `read_io` (event loop: it replaces or merges the statistics)."""
        if raw is not None:
            try:
                self.load(raw)
            except (ValueError, KeyError, TypeError) as e:
                log.warning("feedback: ignoring an unreadable state snapshot at %s: %s", self.state_key, e)
        self.restored = True

    def restore_io(self) -> bool:
        """Read and take the snapshot, when nothing else runs (at start). True once restored or absent."""
        if not self.restored:
            ok, raw = self.read_io()
            if ok:
                self.restore(raw)
        return self.restored

    def save_io(self, payload: bytes) -> bool:
        try:
            self.r.set(self.state_key, payload)
        except (redis.RedisError, OSError) as e:
            self._redis_down(e, "snapshot")
            return False
        self._redis_up()
        return True

    # --- control ---
    def measure(self, now_ms: int) -> tuple[WindowStats, WindowStats]:
        """Expire old data; summarize the window (widened at low traffic until it holds the controller's
        `min_results`, up to `max_window_s`) and its last `observe_s` (event loop; pure)."""
        self.agg.expire(now_ms)
        w, _ = self.agg.sized_window(now_ms, self.ctl_cfg.min_results)
        return w, self.agg.window(now_ms, int(self.ctl_cfg.observe_s * 1000))

    def control_io(self, w: WindowStats, recent: WindowStats, after: AfterChange | None,
                   now_s: float) -> TickResult:
        """Read the thresholds, decide, write the decision (blocking; touches no state the stream mutates)."""
        try:
            th = self.store.get()
        except (redis.RedisError, OSError) as e:
            self._redis_down(e, "read thresholds")
            return TickResult(None, None, f"redis: {e.__class__.__name__}")
        except InvalidThresholds as e:
            log.error("feedback: %s", e)
            return TickResult(None, None, str(e))
        self._redis_up()
        self.thresholds = th
        try:
            heavy_now: Observation | None = observe(self.r, self.s.redis.prefix, "heavy")
        except (redis.RedisError, OSError, ValueError) as e:
            log.warning("feedback: heavy heartbeats unreadable (%s); recovery judged on the window", e)
            heavy_now = None
        d = decide(w, th, self.state, now_s, after, self.ctl_cfg, recent, heavy_now)
        if d.action == "hold" or not self.cfg.control:
            return TickResult(d, None)
        try:
            doc = self.store.update(WHO, d.reason, d.inputs, respect_pins=True, **d.values)
        except (redis.RedisError, OSError) as e:
            self._redis_down(e, "write thresholds")
            return TickResult(d, None, f"redis: {e.__class__.__name__}")
        except InvalidThresholds as e:
            log.error("feedback: the controller proposed invalid values %s: %s", d.values, e)
            return TickResult(d, None, str(e))
        log.info("feedback: v%d %s: %s", doc.version, d.action, d.reason)
        return TickResult(d, doc)

    def after_tick(self, res: TickResult) -> None:
        """Keep the controller's state and the since-change tracking in step with what was written."""
        self.last = res
        d = res.decision
        if d is None:
            return
        if res.written is not None:
            self.thresholds = res.written
            self.state = applied(d, res.written.version)
            if d.action != "change":
                self.agg.track_since(None)
            elif d.change is not None:
                self.agg.track_since(res.written.version)
            # else a change with nothing to watch (a hand-over threshold alone): the watched one keeps its count
        elif d.action == "hold" or not self.cfg.control:
            self.state = d.state
            if self.state.pending is None and self.agg.since is not None:
                self.agg.track_since(None)
        if self.thresholds is not None:
            self.agg.shadow_rate = self.thresholds.shadow_rate

    def publish(self, w: WindowStats) -> None:
        """Prometheus gauges for the window."""
        metrics.HEAVY_SHARE.set(w.heavy_share)
        metrics.HANDOVER_SHARE.set(w.handover_share)
        for tier, t in w.tiers.items():
            if t.p95_ms is not None:
                metrics.TIER_P95.labels(tier).set(t.p95_ms / 1000.0)
            if t.accuracy is not None:
                metrics.ACCURACY.labels(tier, "labels").set(t.accuracy)
            if t.agreement is not None:
                metrics.ACCURACY.labels(tier, "shadow").set(t.agreement)
        th = self.thresholds or Thresholds()
        for tier, ranked in self.scores(th).items():
            for model, value in ranked:
                if value is not None:
                    metrics.MODEL_SCORE.labels(tier, model).set(value)
        if self.thresholds is not None:
            metrics.THRESHOLD_VERSION.set(th.version)
            for key in TUNED:
                metrics.THRESHOLD.labels(key).set(float(getattr(th, key)))

    def scores(self, th: Thresholds) -> dict[str, list[tuple[str, float | None]]]:
        """Per tier, its models best first with the design article's score over their last N results."""
        by_tier: dict[str, dict[str, float | None]] = {}
        for key, rec in self.agg.recent.items():
            tier, _, model = key.partition("/")
            slo = th.light_slo_p95_ms if tier == "light" else th.heavy_slo_p95_ms
            outcomes = rec.correct if len(rec.correct) >= self.cfg.min_score_outcomes else rec.agree
            by_tier.setdefault(tier, {})[model] = score_of(rec.latency, outcomes, slo, self.cfg.alpha,
                                                           self.cfg.min_score_outcomes)
        return {tier: [(m, s[m]) for m in rank_models(s)] for tier, s in by_tier.items()}

    # --- Redis health ---
    def _redis_down(self, e: Exception, what: str) -> None:
        metrics.REDIS_ERRORS.labels("feedback").inc()
        now = time.monotonic()
        if self.redis_ok or now - self._last_warn > 10.0:
            self._last_warn = now
            log.warning("feedback: Redis unavailable (%s: %s); statistics continue, control and snapshots "
                        "resume when it is back", what, e.__class__.__name__)
        self.redis_ok = False

    def _redis_up(self) -> None:
        if not self.redis_ok:
            log.info("feedback: Redis is back")
        self.redis_ok = True

    # --- one interval ---
    async def tick(self, commit: Any = None) -> TickResult:
        """Restore if still pending, measure, control, publish, snapshot, then commit offsets."""
        self.ticks += 1
        if not self.restored:
            ok, raw = await asyncio.to_thread(self.read_io)
            if ok:
                self.restore(raw)
        now = time.time()
        w, recent = self.measure(int(now * 1000))
        res = await asyncio.to_thread(self.control_io, w, recent, self.agg.after_change(), now)
        self.after_tick(res)
        self.publish(w)
        if self.restored:  # never overwrite a snapshot we have not read yet
            saved = await asyncio.to_thread(self.save_io, self.snapshot(int(time.time() * 1000)))
            if saved and commit is not None:
                await commit()
        return res


# --------------------------------------------------------------------------- faust
class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust hard-codes a 1500 ms fetch wait; tansu and a 2 s control loop want it short."""

    fetch_wait_ms = 25
    idle_pause_s: float | None = None
    idle_pause_max_s = 0.2
    rested: Callable[[], bool] = staticmethod(lambda: False)
    logger = logging.getLogger("faust.feedback")  # not this module's: mode names loggers after the subclass

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        if hasattr(consumer, "_fetch_max_wait_ms"):
            consumer._fetch_max_wait_ms = self.fetch_wait_ms
        if self.idle_pause_s:
            _pace_fetches(consumer, self.idle_pause_s, self.idle_pause_max_s, type(self).rested)
        return consumer


def _pace_fetches(consumer: Any, pause_s: float, max_s: float, ready: Callable[[], bool]) -> None:
    """Sleep after a fetch that brought nothing: a broker that answers fetches at once instead of holding them (the
    embedded noida) otherwise gets one fetch after another (an idle feedback agent took 90% of a core; 11% with a
    fixed 5 ms). Once the agent is ready the pause doubles after each fetch up to `max_s`, records or not; before
    that a fetch with records brings it back to `pause_s` and it stays short, so joining and the first tick are not
    slowed (a growing pause from the start made the agent late to say ready). aiokafka builds its fetcher in start() and
    looks the fetch method up on each request."""
    start = consumer.start

    async def paced_start() -> None:
        await start()
        fetcher = consumer._fetcher
        proc = fetcher._proc_fetch_request
        idle = [pause_s]

        async def paced(assignment: Any, node_id: Any, request: Any) -> bool:
            got = bool(await proc(assignment, node_id, request))
            if got and not ready():
                idle[0] = pause_s
            else:
                # Ready, it pauses after records too: the control loop reads its windows every interval, so
                # records may wait `max_s` and come a batch per fetch (at 50 answers/s, fetching again after each
                # record kept the agent's thread at 12% of a core).
                # Closing cancels this task, then awaits it: a CancelledError out of the pause would crash the
                # consumer thread's shutdown and the agent would hang until killed.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(idle[0])
                if ready():
                    idle[0] = min(idle[0] * 2.0, max(pause_s, max_s))
            return got

        fetcher._proc_fetch_request = paced

    consumer.start = paced_start


class _Consumer(faust_aiokafka.Consumer):
    logger = logging.getLogger("faust.feedback")

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class _App(faust.App):
    logger = logging.getLogger("faust.feedback")

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def _credentials(s: Settings) -> Any:
    """faust credentials from the Kafka security settings (None: plaintext)."""
    proto = s.kafka.security_protocol
    if proto == "PLAINTEXT":
        return None
    ctx = None
    if proto in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(cafile=s.kafka.ssl_ca_location)
        if s.kafka.ssl_certificate_location:
            ctx.load_cert_chain(s.kafka.ssl_certificate_location, s.kafka.ssl_key_location,
                                s.kafka.ssl_key_password.get_secret_value() if s.kafka.ssl_key_password else None)
    if proto == "SSL":
        return faust.SSLCredentials(ctx)
    return faust.SASLCredentials(
        username=s.kafka.sasl_username, password=s.kafka.sasl_password.get_secret_value()
        if s.kafka.sasl_password else None, mechanism=s.kafka.sasl_mechanism or "PLAIN", ssl_context=ctx)


def build_app(fb: Feedback) -> faust.App:
    """The faust app: one agent over results + labels, one timer for the control loop."""
    s, cfg = fb.s, fb.cfg
    _ConsumerThread.fetch_wait_ms = cfg.fetch_wait_ms
    _ConsumerThread.idle_pause_s = s.feedback.fetch_pause_ms / 1000 if s.feedback.fetch_pause_ms else None
    # Records wait at most a tenth of the control interval (200 ms at the default 2 s) once the agent is ready.
    _ConsumerThread.idle_pause_max_s = min(0.2, cfg.interval_s / 10)
    _ConsumerThread.rested = staticmethod(lambda: fb.ticks > 0)
    datadir = s.data_dir / "feedback"  # faust wants one even without tables
    datadir.mkdir(parents=True, exist_ok=True)
    app = _App(
        group_of(s),
        broker=",".join(f"kafka://{hp.strip()}" for hp in s.kafka.servers.split(",")),
        broker_credentials=_credentials(s),
        web_enabled=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=3600.0,  # offsets are committed after each snapshot (see Feedback.tick)
        broker_commit_every=1_000_000_000,
        consumer_auto_offset_reset="earliest",  # tansu's ListOffsets end offsets are wrong
        # A restarted agent rejoins as itself (see pipeline.adapters.kafka.make_consumer: noida never expires a
        # dead member).
        consumer_group_instance_id=f"{group_of(s)}-{s.worker_id}" if s.worker_id else None,
        consumer_max_fetch_size=s.max_message_bytes,
        topic_allow_declare=False,
        topic_disable_leader=True,
        datadir=str(datadir),
        key_serializer="raw",
        value_serializer="raw",
    )
    channel = app.topic(fb.topics.results, fb.topics.labels, key_type=bytes, value_type=bytes)

    async def consume(stream: faust.StreamT[bytes]) -> None:
        batches = cast(faust.Stream[bytes], stream).take_events(cfg.take_max, within=cfg.take_within_s)
        async for events in batches:
            now = int(time.time() * 1000)
            for ev in events:
                m = ev.message
                fb.add(m.topic, m.partition, m.offset, ev.value, now, int((m.timestamp or 0) * 1000))

    app.agent(channel, name="feedback")(consume)

    async def control() -> None:
        try:
            await fb.tick(app.consumer.commit)
        except Exception:  # a tick must never take the agent down
            log.exception("feedback: control tick failed")

    app.timer(cfg.interval_s, name="feedback-control")(control)
    return app


class _Worker(faust.Worker):
    """faust's worker with a bounded stop: with the broker gone, faust's own stop takes a minute."""

    grace_s = 15.0
    on_give_up: Callable[[], None] | None = None

    def _on_sigterm(self) -> None:
        self._arm()
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self._arm()
        super()._on_sigint()

    def _arm(self) -> None:
        timer = threading.Timer(self.grace_s, self._give_up)
        timer.daemon = True
        timer.start()

    def _give_up(self) -> None:
        log.warning("feedback: stop did not finish in %.0fs (broker unreachable?); exiting now", self.grace_s)
        if self.on_give_up is not None:
            self.on_give_up()
        logging.shutdown()
        os._exit(0)


# --------------------------------------------------------------------------- entry point
def main(settings: Settings) -> int:
    """Run the feedback agent until SIGTERM / SIGINT; 0 on a clean stop."""
    cfg = settings.feedback
    if not logging.getLogger().handlers:
        logging.basicConfig(level=getattr(logging, settings.log_level.upper(), logging.INFO),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("faust", "mode", "aiokafka"):  # their INFO is a page per rebalance
        logging.getLogger(noisy).setLevel(max(logging.getLogger().level, logging.WARNING))
    check_reachable(settings.kafka.servers, "Kafka")
    metrics.serve(settings.metrics_port)
    fb = Feedback(settings)
    if not fb.restore_io():
        log.warning("feedback: starting without the saved state; it is merged in once Redis answers")
    app = build_app(fb)
    # Ready once the control loop has run: the consumers joined and the thresholds were read and judged. /ready and
    # the heartbeat say it from the same check.
    def readiness() -> dict[str, bool]:
        return {"controller_ticked": fb.ticks > 0}

    READINESS.require(readiness)
    beat = Heartbeat(fb.r, settings.redis.prefix, AGENT, f"feedback-{socket.gethostname()}-{os.getpid()}",
                     settings.heartbeat.interval_s, settings.heartbeat.ttl_s,
                     lambda: {"agent": "feedback", "ready": all(readiness().values())}).start()
    worker = _Worker(app, loglevel=logging.getLevelName(logging.getLogger().level), quiet=True,
                     redirect_stdouts=False, override_logging=False)
    worker.spinner = None
    worker.on_give_up = lambda: _final_save(fb)
    log.info("feedback: %s + %s, window %.0fs, control every %.1fs, group %s", fb.topics.results,
             fb.topics.labels, cfg.window_s, cfg.interval_s, group_of(settings))
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        beat.stop()
        _final_save(fb)
    return code


def _final_save(fb: Feedback) -> None:
    """The last batches were counted after the last tick: keep them."""
    if fb.restored and fb.save_io(fb.snapshot(int(time.time() * 1000))):
        log.info("feedback: state saved (%d results so far)", fb.agg.observed)


if __name__ == "__main__":  # `python -m pipeline.agents.feedback`: settings from the environment
    from pipeline.settings import get_settings

    sys.exit(main(get_settings()))

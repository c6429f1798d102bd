"""Routing thresholds in Redis: one versioned, bounds-checked document, its history, and a process cache.

Keys (under the Redis prefix, default `tierflow:`):
- `thresholds`          the current document (JSON)
- `thresholds:history`  every version ever written, oldest first (JSON list entries)
- `thresholds:changed`  pub/sub channel: a version number is published on every change
- `vip` / `vip:changed` the VIP user set and its change channel
- `epoch`               set once this Redis holds the control state; absent means an empty (restarted, flushed) Redis

With a `ControlLog`, Redis is a cache of the control topic: every threshold version and VIP change is written there
too, and an empty Redis is filled from it (`ControlCache.restore`) before anything routes on defaults.

Readers on the hot path use `ThresholdCache`: a background thread refreshes on pub/sub and on a slow
poll, so routing never waits on Redis and keeps the last-known values when Redis is down.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from pydantic import ValidationError

from pipeline import metrics
from pipeline.adapters.control_cache import ControlCache
from pipeline.adapters.control_log import ControlLog
from pipeline.adapters.periodic import Periodic
from pipeline.contracts.keys import ControlKeys, Keys
from pipeline.core.control import vip_value
from pipeline.core.thresholds import TUNABLE, Thresholds, _first_error
from pipeline.errors import InvalidThresholds, ServiceUnavailable
from pipeline.settings import Settings

log = logging.getLogger(__name__)


class ThresholdStore:
    """Reads and writes the thresholds document in Redis, atomically, with history and notification."""

    def __init__(self, client: redis.Redis, prefix: str = "tierflow:", log: ControlLog | None = None) -> None:
        self.r, self.log = client, log
        self.keys = keys = Keys(prefix)
        self.key, self.history_key, self.channel = keys.thresholds, keys.thresholds_history, keys.thresholds_changed
        self.vip_key, self.vip_channel, self.epoch_key = keys.vip, keys.vip_changed, keys.epoch
        self.cache = ControlCache(client, prefix, log)
        self._unwritten: list[tuple[str, bytes | None]] = []  # versions the control topic has not taken yet

    @classmethod
    def of(cls, settings: Settings, client: redis.Redis) -> ThresholdStore:
        """The store of a pipeline: Redis as the cache of the pipeline's control topic."""
        return cls(client, settings.redis.prefix, ControlLog(settings))

    def get(self) -> Thresholds:
        """The current document; the defaults (written as version 1) when none exists."""
        return self.get_or_none() or self.init()

    def get_or_none(self) -> Thresholds | None:
        raw = self.r.get(self.key)
        return None if raw is None else self._parse(raw)

    def _parse(self, raw: bytes | str) -> Thresholds:
        try:
            return Thresholds.model_validate_json(raw)
        except (ValidationError, ValueError) as e:
            # A hostile or corrupt value must not break routing: refuse it loudly.
            msg = _first_error(e) if isinstance(e, ValidationError) else str(e)
            raise InvalidThresholds(f"thresholds in Redis at {self.key} are invalid: {msg}") from None

    def init(self, initial: Thresholds | None = None) -> Thresholds:
        """The current document. Where Redis has none: what the control topic holds (restored with every version
        and the VIPs), else `initial` (or the defaults) written as version 1."""
        self.cache.ensure_restored()
        doc = initial or Thresholds(updated_at=time.time())
        payload = doc.model_dump_json()
        if self.r.set(self.key, payload, nx=True):
            self.r.rpush(self.history_key, payload)
            self.r.publish(self.channel, str(doc.version))
            self._write_log([(ControlKeys.thresholds(doc.version), payload.encode())])
            return doc
        return self._parse(self.r.get(self.key) or payload)

    def _write_log(self, records: list[tuple[str, bytes | None]]) -> None:
        """Put records on the control topic, with any an earlier try could not; keep them for the next when the
        broker does not take them (Redis already has them: routing is not held up by the broker)."""
        if self.log is None:
            return
        pending = [*self._unwritten, *records]
        try:
            self.log.put(pending)
            self._unwritten = []
        except ServiceUnavailable as e:
            self._unwritten = pending
            log.warning("%s; kept in Redis, written to the topic with the next change", e)

    def update(self, who: str, why: str, inputs: dict[str, Any] | None = None, *,
               respect_pins: bool = False, **values: Any) -> Thresholds:
        """Apply `values` as a new version (optimistic transaction; retried on a concurrent write)."""
        self.cache.ensure_restored()  # an empty Redis first: a new version follows the newest, not the defaults
        while True:
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(self.key)
                    raw = pipe.get(self.key)
                    current = self._parse(raw) if raw is not None else Thresholds(updated_at=time.time())
                    if respect_pins:
                        values = {k: v for k, v in values.items() if k not in current.pinned}
                    new = current.changed(who, why, inputs, **values)
                    payload = new.model_dump_json()
                    pipe.multi()
                    pipe.set(self.key, payload)
                    pipe.rpush(self.history_key, payload)
                    pipe.publish(self.channel, str(new.version))
                    pipe.execute()
                except redis.WatchError:
                    continue
            # After the commit: Redis's version check decides the number, so the topic never holds a loser's
            # document under the winner's version.
            self._write_log([(ControlKeys.thresholds(new.version), payload.encode())])
            return new

    def history(self, last: int | None = None) -> list[Thresholds]:
        start = -last if last else 0
        return [Thresholds.model_validate_json(x) for x in self.r.lrange(self.history_key, start, -1)]

    def version(self, version: int) -> Thresholds:
        for doc in self.history():
            if doc.version == version:
                return doc
        raise InvalidThresholds(f"no threshold version {version} in the history")

    def rollback(self, version: int, who: str, why: str | None = None) -> Thresholds:
        """Restore the values of `version` as a new version (history is never rewritten)."""
        old = self.version(version)
        values = {k: getattr(old, k) for k in TUNABLE}
        return self.update(who, why or f"rollback to v{version}", {"rollback_of": version},
                           pinned=old.pinned, **values)

    # --- VIP users ---
    def vip_add(self, *users: str) -> None:
        """Durable first: the control topic takes the change (raises when it cannot), then Redis."""
        if self.log is not None:
            self.log.put([(ControlKeys.vip(u), vip_value()) for u in users])
        self.r.sadd(self.vip_key, *users)
        self.r.publish(self.vip_channel, "add")

    def vip_remove(self, *users: str) -> None:
        if self.log is not None:
            self.log.put([(ControlKeys.vip(u), None) for u in users])
        self.r.srem(self.vip_key, *users)
        self.r.publish(self.vip_channel, "remove")

    def vips(self) -> set[str]:
        return {m.decode() if isinstance(m, bytes) else m for m in self.r.smembers(self.vip_key)}


class ThresholdCache:
    """In-process copy of the thresholds and VIP set, refreshed by pub/sub and a slow poll.

    `current` and `vips` are plain attribute reads (atomic under the GIL): the hot path never blocks.
    """

    def __init__(self, store: ThresholdStore, poll_s: float = 5.0, component: str = "ingest",
                 on_change: Callable[[Thresholds], None] | None = None) -> None:
        self.store = store
        self.poll_s = poll_s
        self.component = component
        self.on_change = on_change
        self.current: Thresholds = Thresholds()
        self.vips: frozenset[str] = frozenset()
        self.stale = True
        self._refresher: Periodic | None = None
        self._pubsub: redis.client.PubSub | None = None
        self._last_poll = 0.0
        self._last_epoch_check = 0.0
        self._last_warn = 0.0
        self.loaded = threading.Event()

    def start(self) -> ThresholdCache:
        """Load once (best effort) and start the refresher thread."""
        self.refresh()
        # interval 0: each turn blocks up to 0.2 s in its pub/sub read, which is what paces the loop
        self._refresher = Periodic("threshold-cache", 0.0, self._listen, on_exit=self._unsubscribe).start()
        return self

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.close()

    def is_vip(self, user_id: str | None) -> bool:
        return user_id is not None and user_id in self.vips

    def refresh(self) -> bool:
        """Reload from Redis; on failure keep the last-known values. True when it succeeded."""
        try:
            self.store.cache.ensure_restored()
            doc = self.store.get_or_none()
            if doc is None:
                # Redis came back empty (restarted without persistence): restore what we were routing with,
                # rather than falling back to defaults and resetting the version sequence.
                doc = self.store.init(self.current if self.loaded.is_set() else None)
                if self.loaded.is_set():
                    log.warning("%s: Redis had no thresholds; restored last-known v%d", self.component, doc.version)
            vips = frozenset(self.store.vips())
        except (redis.RedisError, OSError, InvalidThresholds) as e:
            self._mark_stale(e)
            return False
        changed = doc.version != self.current.version or self.stale
        self.current, self.vips = doc, vips
        if self.stale:
            log.info("%s: thresholds loaded from Redis (v%d)", self.component, doc.version)
        self.stale = False
        metrics.THRESHOLDS_STALE.set(0)
        self._publish_metrics(doc)
        self.loaded.set()
        if changed and self.on_change is not None:
            self.on_change(doc)
        return True

    def _publish_metrics(self, doc: Thresholds) -> None:
        metrics.THRESHOLD_VERSION.set(doc.version)
        for key in ("length_threshold", "escalate_below", "shadow_rate", "heavy_budget", "abstain_above",
                    "handover_above", "handover_budget", "heavy_slo_p95_ms", "light_slo_p95_ms"):
            metrics.THRESHOLD.labels(key).set(float(getattr(doc, key)))

    def _mark_stale(self, e: Exception) -> None:
        self.stale = True
        metrics.THRESHOLDS_STALE.set(1)
        metrics.REDIS_ERRORS.labels(self.component).inc()
        now = time.monotonic()
        if now - self._last_warn > 10.0:  # rate-limited: an outage must not flood the log
            self._last_warn = now
            log.warning("%s: Redis unavailable (%s); routing with last-known thresholds v%d",
                        self.component, e.__class__.__name__, self.current.version)

    def _listen(self) -> None:
        """One turn of the refresher: (re)subscribe if needed, then wait up to 0.2 s for a change (pub/sub) and
        refresh on one, or once `poll_s` has passed without. Redis trouble: stale, resubscribe 0.5 s later."""
        try:
            if self._pubsub is None:
                self._pubsub = self.store.r.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self.store.channel, self.store.vip_channel)
                self.refresh()  # catch up on anything missed while (re)subscribing
                self._last_poll = time.monotonic()
            msg = self._pubsub.get_message(timeout=0.2)
            now = time.monotonic()
            if self.store.log is not None and msg is None and now - self._last_epoch_check > 0.5:
                # a flushed Redis publishes nothing: look for its epoch twice a second, so a restore follows
                # within a second (one EXISTS each time)
                self._last_epoch_check = now
                if not self.store.cache.seeded():
                    msg = {"type": "flushed"}
            if msg is not None or now - self._last_poll > self.poll_s:
                self.refresh()
                self._last_poll = time.monotonic()
        except (redis.RedisError, OSError) as e:
            self._mark_stale(e)
            self._unsubscribe()
            if self._refresher is not None:
                self._refresher.stopping.wait(0.5)

    def _unsubscribe(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()

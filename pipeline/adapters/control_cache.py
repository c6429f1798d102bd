"""Redis as the cache of the control topic: whether Redis holds the control state (the `epoch` key) and, where
it does not (restarted, flushed, new), filling it from the topic.

Every agent and command that reads control state can restore, so a Redis that comes back empty is refilled by
whichever notices first (the ingest agent looks twice a second); the writes are version-checked and one restorer
wins. The records and how they add up are `pipeline/core/control.py`; the topic is `control_log.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

import redis

from pipeline.adapters.control_log import ControlLog
from pipeline.contracts.keys import ControlKeys, Keys
from pipeline.core.control import ControlState
from pipeline.core.thresholds import Thresholds
from pipeline.errors import ServiceUnavailable
from pipeline.settings import Settings

log = logging.getLogger(__name__)


class ControlCache:
    """Knows whether Redis holds the control state and restores it from the control topic."""

    def __init__(self, client: redis.Redis, prefix: str = "tierflow:", log: ControlLog | None = None) -> None:
        self.r, self.keys, self.log = client, Keys(prefix), log
        self._failed_at = 0.0  # when reading the control topic last failed (0: it did not)

    @classmethod
    def of(cls, settings: Settings, client: redis.Redis) -> ControlCache:
        return cls(client, settings.redis.prefix, ControlLog(settings))

    def ensure_restored(self) -> None:
        """Restore an empty Redis from the control topic first (a no-op once it holds the state, or without a log).
        When the topic cannot be read, Redis serves alone meanwhile (restore says so)."""
        if self.log is not None and not self.seeded():
            with contextlib.suppress(ServiceUnavailable):
                self.restore()

    def seeded(self) -> bool:
        """Whether this Redis holds the control state (False: it is empty, restarted or flushed)."""
        return bool(self.r.exists(self.keys.epoch))

    def restore(self, state: ControlState | None = None) -> str | None:
        """Fill an empty Redis from the control topic (`state`: already read from it). Version-checked: a document
        Redis already has at the same or a newer version stays, VIPs are added; one restorer wins (the epoch key
        is watched) and the others find it done. Returns what was restored (None: nothing needed)."""
        if self.log is None:
            return None
        if state is None:
            if time.monotonic() - self._failed_at < 1.0:  # at most one try a second while the broker is away
                raise ServiceUnavailable(f"the control topic {self.log.topic} could not be read a moment ago")
            try:
                state = self.log.read()
            except ServiceUnavailable as e:
                if not self._failed_at:
                    log.warning("Redis is empty and the control topic cannot be read (%s); going on with what "
                                "this process knows, trying again each second", e)
                self._failed_at = time.monotonic()
                raise
            self._failed_at = 0.0
        while True:
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(self.keys.epoch, self.keys.thresholds)
                    if pipe.exists(self.keys.epoch):
                        return None
                    raw = pipe.get(self.keys.thresholds)
                    have = _parsed(raw)
                    newest = state.current
                    take = newest is not None and (have is None or have.version < newest.version)
                    jobs = {job: progress for job, progress in state.replay_jobs.items()
                            if progress and not pipe.exists(self.keys.replay_job(job))}
                    models = (state.models or state.model_history) and not pipe.exists(
                        self.keys.model_live, self.keys.model_versions, self.keys.model_history)
                    pipe.multi()
                    if take:
                        pipe.delete(self.keys.thresholds_history)
                        pipe.rpush(self.keys.thresholds_history, *(d.model_dump_json() for d in state.thresholds))
                        pipe.set(self.keys.thresholds, state.thresholds[-1].model_dump_json())
                        pipe.publish(self.keys.thresholds_changed, str(state.thresholds[-1].version))
                    if state.vips:
                        pipe.sadd(self.keys.vip, *state.vips)
                        pipe.publish(self.keys.vip_changed, "restore")
                    for job, progress in jobs.items():
                        pipe.hset(self.keys.replay_job(job), mapping=dict(progress))  # type: ignore[arg-type]
                    if state.replay_answered:
                        pipe.sadd(self.keys.replay_answered, *state.replay_answered)
                    if models:
                        self._restore_models(pipe, state)
                    pipe.set(self.keys.epoch, f"restored {time.time():.3f}")
                    pipe.execute()
                except redis.WatchError:
                    continue
            if have is not None and newest is not None and have.version > newest.version:
                # Redis is ahead (the topic missed versions while the broker was away): the topic catches up
                ahead = [_parsed(x) for x in self.r.lrange(self.keys.thresholds_history, 0, -1)]
                with contextlib.suppress(ServiceUnavailable):  # said by the next writer's retry
                    self.log.put([(ControlKeys.thresholds(d.version), d.model_dump_json().encode())
                                  for d in ahead if d is not None and d.version > newest.version])
            said = f"restored {state.summary()} from the control topic {self.log.topic}" if not state.empty \
                else f"the control topic {self.log.topic} is empty: Redis starts from the defaults"
            log.info("%s", said)
            return said

    def _restore_models(self, pipe: redis.client.Pipeline, state: ControlState) -> None:
        """The learned light model's versions, history and pointer, queued on `pipe` (inside the restore's MULTI);
        light workers reload on the change message if the pointer moved."""
        for version, m in state.models.items():
            pipe.hset(self.keys.model_version(version), mapping={"weights": m.weights,
                                                                 "manifest": json.dumps(m.manifest)})
            pipe.zadd(self.keys.model_versions, {version: m.created})
        if state.model_history:
            pipe.rpush(self.keys.model_history, *(json.dumps(e) for e in state.model_history))
        if state.model_live is not None:
            pipe.set(self.keys.model_live, state.model_live)
            pipe.publish(self.keys.model_changed, state.model_live)


def _parsed(raw: bytes | str | None) -> Thresholds | None:
    """A document from Redis, or None where there is none or it is not valid (the topic's then wins)."""
    if raw is None:
        return None
    try:
        return Thresholds.model_validate_json(raw)
    except ValueError:  # pydantic's ValidationError is one
        return None

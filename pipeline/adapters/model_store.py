"""The light model's versions in Redis: weights and manifest per version, the live pointer, the history.

Weights live in Redis (a char n-gram model is under a megabyte) so every light worker, on any host, loads the
same bytes a pointer names, with no shared disk. Keys are in `pipeline/contracts/keys.py`:
- `models:light:v:<version>`  hash {weights, manifest}: the npz the trainer wrote and its provenance
- `models:light:versions`     sorted set of versions by creation time
- `models:light:live`         the version serving; unset (or `packaged`) means the domain pack's own
- `models:light:changed`      pub/sub: the new live version, published with every change
- `models:light:history`      JSON events {at, action, version, previous, who, why, evidence}, oldest first

A pointer change and its history entry are one MULTI: no version goes live without its reason written.

With a `ControlLog` every one of these is on the control topic too (versions and history first, the pointer after
Redis's check decides it), so a Redis that lost them gets them back (`ControlCache.restore`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from pipeline.adapters.control_cache import ControlCache
from pipeline.adapters.control_log import ControlLog
from pipeline.contracts.keys import ControlKeys, Keys
from pipeline.core.control import model_manifest
from pipeline.errors import ConfigError
from pipeline.settings import Settings

PACKAGED = "packaged"  # the domain pack's trained model, served when no learned version is live


class ModelStore:
    """Versions, the live pointer and the history of the light model."""

    def __init__(self, client: redis.Redis, prefix: str = "tierflow:", keep: int = 20,
                 log: ControlLog | None = None) -> None:
        self.r, self.keys, self.keep, self.log = client, Keys(prefix), keep, log
        self.cache = ControlCache(client, prefix, log)

    @classmethod
    def of(cls, settings: Settings, client: redis.Redis) -> ModelStore:
        """The store of a pipeline: Redis as the cache of the pipeline's control topic."""
        return cls(client, settings.redis.prefix, log=ControlLog(settings))

    def _write_log(self, records: list[tuple[str, bytes | None]]) -> None:
        if self.log is not None:
            self.log.put(records)

    def _restored(self) -> None:
        """Before a write: an empty Redis gets the versions and history back first, so none is written over."""
        self.cache.ensure_restored()

    # --- versions ---
    def put(self, version: str, weights: bytes, manifest: dict[str, Any]) -> None:
        """Store a new version (a candidate until promoted); the oldest beyond `keep` are pruned."""
        self._restored()
        created = time.time()
        self._write_log([(ControlKeys.model_weights(version), weights),
                         (ControlKeys.model_version(version), model_manifest(manifest, created))])
        with self.r.pipeline() as pipe:
            pipe.hset(self.keys.model_version(version), mapping={"weights": weights,
                                                                 "manifest": json.dumps(manifest)})
            pipe.zadd(self.keys.model_versions, {version: created})
            pipe.execute()
        self.prune()

    def weights(self, version: str) -> bytes:
        raw = self.r.hget(self.keys.model_version(version), "weights")
        if raw is None:
            raise ConfigError(f"no light model version {version!r} in Redis (`tierflow models list` shows them)")
        return raw if isinstance(raw, bytes) else raw.encode()

    def manifest(self, version: str) -> dict[str, Any]:
        raw = self.r.hget(self.keys.model_version(version), "manifest")
        if raw is None:
            raise ConfigError(f"no light model version {version!r} in Redis (`tierflow models list` shows them)")
        out: dict[str, Any] = json.loads(raw)
        return out

    def update_manifest(self, version: str, **fields: Any) -> dict[str, Any]:
        manifest = {**self.manifest(version), **fields}
        if self.log is not None:
            created = self.r.zscore(self.keys.model_versions, version) or time.time()
            self._write_log([(ControlKeys.model_version(version), model_manifest(manifest, float(created)))])
        self.r.hset(self.keys.model_version(version), "manifest", json.dumps(manifest))
        return manifest

    def versions(self) -> list[str]:
        """Every stored version, newest first."""
        return [v.decode() if isinstance(v, bytes) else str(v)
                for v in self.r.zrevrange(self.keys.model_versions, 0, -1)]

    def prune(self) -> None:
        """Drop the oldest versions beyond `keep`, never the live one nor the versions a rollback would restore."""
        versions = self.versions()
        if len(versions) <= self.keep:
            return
        protected = {self.live(), *(e.get("previous") for e in self.history(last=self.keep))}
        for v in versions[self.keep:]:
            if v not in protected:
                self._write_log([(ControlKeys.model_version(v), None), (ControlKeys.model_weights(v), None)])
                with self.r.pipeline() as pipe:
                    pipe.delete(self.keys.model_version(v))
                    pipe.zrem(self.keys.model_versions, v)
                    pipe.execute()

    # --- the pointer and its history ---
    def live(self) -> str:
        raw = self.r.get(self.keys.model_live)
        return PACKAGED if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))

    def set_live(self, version: str, action: str, who: str, why: str,
                 evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        """Point the light tier at `version` (PACKAGED: the pack's own) and record why, atomically."""
        self._restored()
        if version != PACKAGED and not self.r.exists(self.keys.model_version(version)):
            raise ConfigError(f"no light model version {version!r} in Redis (`tierflow models list` shows them)")
        while True:
            with self.r.pipeline() as pipe:
                try:
                    pipe.watch(self.keys.model_live)
                    raw = pipe.get(self.keys.model_live)
                    previous = PACKAGED if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))
                    event = self._event(action, version, who, why, evidence, previous)
                    pipe.multi()
                    pipe.set(self.keys.model_live, version)
                    pipe.rpush(self.keys.model_history, json.dumps(event))
                    pipe.publish(self.keys.model_changed, version)
                    pipe.execute()
                except redis.WatchError:
                    continue
            # After the commit, as for thresholds: Redis's check decides which change won
            self._write_log([(ControlKeys.model_event(event["at"], action, version), json.dumps(event).encode()),
                             (ControlKeys.MODEL_LIVE, version.encode())])
            return event

    def record(self, action: str, version: str, who: str, why: str,
               evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        """A history entry that moves no pointer (a candidate stored, a candidate rejected)."""
        self._restored()
        event = self._event(action, version, who, why, evidence, self.live())
        self._write_log([(ControlKeys.model_event(event["at"], action, version), json.dumps(event).encode())])
        self.r.rpush(self.keys.model_history, json.dumps(event))
        return event

    def history(self, last: int | None = None) -> list[dict[str, Any]]:
        start = -last if last else 0
        return [json.loads(x) for x in self.r.lrange(self.keys.model_history, start, -1)]

    def parent_of_live(self) -> str | None:
        """The version the live one replaced when it was promoted: what a rollback restores (None: the packaged
        model is live, or the live version was never promoted)."""
        live = self.live()
        for e in reversed(self.history()):
            if e["version"] == live and e["action"] == "promote":
                return str(e["previous"])
        return None

    @staticmethod
    def _event(action: str, version: str, who: str, why: str, evidence: dict[str, Any] | None,
               previous: str) -> dict[str, Any]:
        return {"at": round(time.time(), 3), "action": action, "version": version, "previous": previous,
                "who": who, "why": why, "evidence": evidence or {}}

"""Control state as a changelog: what the control topic's records add up to. Pure: the topic is
`pipeline.adapters.control_log`, the Redis side `pipeline.adapters.threshold_store`.

The records are keyed as `ControlKeys` names them, one key per fact (a threshold version, a VIP), so a compacted
topic keeps every fact's latest record and a null value (a tombstone) deletes one. Folding them in log order gives
the state; the latest record of a key wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.contracts.keys import ControlKeys
from pipeline.core.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """A learned light model version as the control topic keeps it."""

    weights: bytes
    manifest: Mapping[str, Any]
    created: float


@dataclass(frozen=True, slots=True)
class ControlState:
    """Every threshold version (oldest first), the VIP set, replay jobs' progress and the request ids replays
    answered, as the control topic holds them."""

    thresholds: tuple[Thresholds, ...] = ()
    vips: frozenset[str] = frozenset()
    replay_jobs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    replay_answered: frozenset[str] = frozenset()
    models: Mapping[str, ModelVersion] = field(default_factory=dict)  # the learned light model's stored versions
    model_live: str | None = None  # the live pointer (None: never set, the packaged model serves)
    model_history: tuple[Mapping[str, Any], ...] = ()  # every promotion, rejection and rollback, oldest first
    skipped: int = 0  # records that were not ours or not valid: counted, never fatal

    @property
    def current(self) -> Thresholds | None:
        return self.thresholds[-1] if self.thresholds else None

    @property
    def empty(self) -> bool:
        return not (self.thresholds or self.vips or self.replay_jobs or self.replay_answered or self.models
                    or self.model_history)

    def summary(self) -> str:
        th = f"thresholds v{self.current.version} ({len(self.thresholds)} versions)" if self.current \
            else "no thresholds"
        out = f"{th}, {len(self.vips)} VIP{'' if len(self.vips) == 1 else 's'}"
        if self.models or self.model_history:
            out += f", light model {self.model_live or 'packaged'} ({len(self.models)} versions stored)"
        if self.replay_jobs or self.replay_answered:
            out += f", {len(self.replay_jobs)} replay job(s) with {len(self.replay_answered)} answered ids"
        return out


def fold(records: Iterable[tuple[bytes | str | None, bytes | None]]) -> ControlState:
    """The state that `(key, value)` records in log order describe."""
    versions: dict[int, Thresholds] = {}
    vips: set[str] = set()
    jobs: dict[str, dict[str, str]] = {}
    answered: set[str] = set()
    manifests: dict[str, tuple[Mapping[str, Any], float]] = {}
    weights: dict[str, bytes] = {}
    events: dict[str, Mapping[str, Any]] = {}
    live: str | None = None
    skipped = 0
    for raw_key, value in records:
        key = (raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else raw_key) or ""
        kind, _, name = key.partition(":")
        if key.startswith(ControlKeys.MODEL_WEIGHTS + ":"):
            version = key[len(ControlKeys.MODEL_WEIGHTS) + 1:]
            if value is None:
                weights.pop(version, None)
            else:
                weights[version] = value
        elif key.startswith(ControlKeys.MODEL_VERSION + ":"):
            version = key[len(ControlKeys.MODEL_VERSION) + 1:]
            if value is None:
                manifests.pop(version, None)
                continue
            try:
                doc = orjson.loads(value)
                manifests[version] = (doc["manifest"], float(doc["created"]))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                skipped += 1
        elif key == ControlKeys.MODEL_LIVE:
            live = None if value is None else value.decode("utf-8", "replace")
        elif key.startswith(ControlKeys.MODEL_EVENT + ":"):
            try:
                event = orjson.loads(value) if value is not None else None
            except orjson.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(event, dict):
                events[key] = event
            elif value is None:
                events.pop(key, None)
            else:
                skipped += 1
        elif key.startswith(ControlKeys.REPLAY_ANSWERED + ":"):
            rid = key[len(ControlKeys.REPLAY_ANSWERED) + 1:]
            (answered.discard if value is None else answered.add)(rid)
        elif key.startswith(ControlKeys.REPLAY_JOB + ":"):
            job = key[len(ControlKeys.REPLAY_JOB) + 1:]
            if value is None:
                jobs.pop(job, None)
                continue
            try:
                progress = orjson.loads(value)
            except orjson.JSONDecodeError:
                skipped += 1
                continue
            if not isinstance(progress, dict):
                skipped += 1
                continue
            jobs[job] = {str(k): str(v) for k, v in progress.items()}
        elif kind == ControlKeys.THRESHOLDS and name.isdigit():
            if value is None:
                versions.pop(int(name), None)
                continue
            try:
                doc = Thresholds.model_validate_json(value)
            except (ValidationError, ValueError):
                skipped += 1
                continue
            versions[doc.version] = doc
        elif kind == ControlKeys.VIP and name:
            if value is None:
                vips.discard(name)
            else:
                vips.add(name)
        else:
            skipped += 1
    # a version is whole with both its records; one without the other (a write cut short) is left out
    models = {v: ModelVersion(weights[v], m, created) for v, (m, created) in manifests.items() if v in weights}
    return ControlState(tuple(versions[v] for v in sorted(versions)), frozenset(vips), jobs, frozenset(answered),
                        models, live, tuple(events[k] for k in sorted(events)), skipped)


def replay_progress(progress: Mapping[str, object]) -> bytes:
    """A replay job's progress record: the fields of its Redis hash, as strings (as Redis returns them)."""
    return orjson.dumps({k: str(v) for k, v in progress.items()})


def model_manifest(manifest: Mapping[str, Any], created: float) -> bytes:
    """A stored model version's manifest record (its weights are a record of their own, as raw bytes)."""
    return orjson.dumps({"manifest": manifest, "created": created})


def vip_value() -> bytes:
    """A VIP's record: its presence is the fact (a tombstone removes it); the value says so for a human reader."""
    return orjson.dumps({"vip": True})

"""Control state as a changelog: what the control topic's records add up to. Pure: the topic is
`pipeline.adapters.control_log`, the Redis side `pipeline.adapters.threshold_store`.

The records are keyed as `ControlKeys` names them, one key per fact (a threshold version, a VIP), so a compacted
topic keeps every fact's latest record and a null value (a tombstone) deletes one. Folding them in log order gives
the state; the latest record of a key wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from pipeline.contracts.keys import ControlKeys
from pipeline.core.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class ControlState:
    """Every threshold version (oldest first) and the VIP set, as the control topic holds them."""

    thresholds: tuple[Thresholds, ...] = ()
    vips: frozenset[str] = frozenset()
    skipped: int = 0  # records that were not ours or not valid: counted, never fatal

    @property
    def current(self) -> Thresholds | None:
        return self.thresholds[-1] if self.thresholds else None

    @property
    def empty(self) -> bool:
        return not self.thresholds and not self.vips

    def summary(self) -> str:
        th = f"thresholds v{self.current.version} ({len(self.thresholds)} versions)" if self.current \
            else "no thresholds"
        return f"{th}, {len(self.vips)} VIP{'' if len(self.vips) == 1 else 's'}"


def fold(records: Iterable[tuple[bytes | str | None, bytes | None]]) -> ControlState:
    """The state that `(key, value)` records in log order describe."""
    versions: dict[int, Thresholds] = {}
    vips: set[str] = set()
    skipped = 0
    for raw_key, value in records:
        key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else raw_key
        kind, _, name = (key or "").partition(":")
        if kind == ControlKeys.THRESHOLDS and name.isdigit():
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
    return ControlState(tuple(versions[v] for v in sorted(versions)), frozenset(vips), skipped)


def vip_value() -> bytes:
    """A VIP's record: its presence is the fact (a tombstone removes it); the value says so for a human reader."""
    return orjson.dumps({"vip": True})

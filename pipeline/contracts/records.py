"""Typed records that cross process boundaries without a JSON Schema of their own, with one builder and one reader.

TypedDicts cost nothing at run time (a record stays a plain dict, as orjson reads and writes it); the type checker
finds every reader of a field that changes.
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson


class Heartbeat(TypedDict):
    """A worker's (or agent's) health, written every `heartbeat_interval_s` under `Keys.heartbeat(tier, id)`.

    Latencies are of answers, in ms over the last few seconds: `p95_ms` of all of them, `live_p95_ms` of live
    ones only (replays excluded) and `live_recent_*` of the last `RECENT_S`. `busy_ms`: how long the batch in hand
    has taken so far (0 between batches). Agents that are not workers (ingest, feedback) fill only `agent` and
    `ready` (and ingest `consumed`); their tier is `agent`.

    Health decisions (ingest's degrade, the controller's shed and restore) read `live_p95_ms` and `busy_ms`: the
    SLO is the live customers'; a replay's backlog is paced by the replay's own guard and must not degrade live
    traffic to light. `p95_ms` is shown by `tierflow status` (what the workers do, all of it).
    """

    ts: float
    worker: str
    tier: str
    agent: str
    ready: bool
    lag: int
    p95_ms: float
    live_p95_ms: float
    live_recent_p95_ms: float
    live_recent_n: int
    busy_ms: float
    processed: int
    consumed: int
    model: str
    device: str


_DEFAULTS: Heartbeat = {"ts": 0.0, "worker": "?", "tier": "?", "agent": "", "ready": False, "lag": 0, "p95_ms": 0.0,
                        "live_p95_ms": 0.0, "live_recent_p95_ms": 0.0, "live_recent_n": 0, "busy_ms": 0.0,
                        "processed": 0, "consumed": 0, "model": "?", "device": "?"}
_TYPES: dict[str, type] = {k: type(v) for k, v in _DEFAULTS.items()}


def heartbeat(**fields: Any) -> Heartbeat:
    """The one builder: every field present, of its type (missing ones at their defaults)."""
    unknown = set(fields) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"heartbeat: unknown fields {sorted(unknown)}")
    return heartbeat_of_dict(fields)


def heartbeat_of_dict(d: dict[str, Any]) -> Heartbeat:
    out: dict[str, Any] = dict(_DEFAULTS)
    for k, kind in _TYPES.items():
        v = d.get(k)
        if v is None:
            continue
        out[k] = bool(v) if kind is bool else kind(v)
    return out  # type: ignore[return-value]


def heartbeat_of(raw: bytes | str) -> Heartbeat | None:
    """The one reader: a heartbeat from Redis, every field present; None for one that is not (logged by no one:
    a heartbeat expires by itself within seconds, and the next beat overwrites it)."""
    try:
        d = orjson.loads(raw)
        return heartbeat_of_dict(d) if isinstance(d, dict) else None
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None


def dump_heartbeat(hb: Heartbeat) -> bytes:
    return orjson.dumps(hb)

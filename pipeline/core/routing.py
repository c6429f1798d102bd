"""Pure routing: (features, thresholds, health) -> Route. Each rule names itself in `reason`.

Rules, first match wins: image -> multimodal; VIP -> heavy; longer than `length_threshold` (English-equivalent
characters: features' `length`) -> heavy; otherwise light. Heavy-bound traffic goes to light while the heavy tier is
unhealthy (`degraded=True`, reason suffixed with why). Escalation of unsure light answers is the worker's
half of the cascade; its threshold (`escalate_below`) travels with each routed message.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from pipeline.contracts.records import Features
from pipeline.contracts.topics import Tier


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """Where a request goes and the rule that sent it there.

    `route()` hands out one shared instance per outcome, so a Route compares and hashes by identity:
    cheap enough to count per message on the ingest hot path.
    """

    tier: Tier
    reason: str
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class TierHealth:
    """Ingest's view of the heavy tier (pipeline/core/health.py decides it, with hysteresis)."""

    heavy_ok: bool = True
    reason: str = "ok"  # "lag", "slow", "no_workers" when not ok


HEALTHY = TierHealth()


_IMAGE = Route(Tier.MULTIMODAL, "image")
_SHORT = Route(Tier.LIGHT, "short")
_HEAVY = {"vip": Route(Tier.HEAVY, "vip"), "length": Route(Tier.HEAVY, "length")}
_DEGRADED: dict[tuple[str, str], Route] = {}


def route(features: Features, length_threshold: int, health: TierHealth = HEALTHY) -> Route:
    """Pick the tier for one request. `features` is pipeline.core.features.extract()'s dict."""
    if features["has_image"]:
        return _IMAGE
    if features["vip"]:
        wanted = "vip"
    elif features.get("length", features["chars"]) > length_threshold:
        wanted = "length"
    else:
        return _SHORT
    if not health.heavy_ok:
        return _degraded(wanted, health.reason)
    return _HEAVY[wanted]


def _degraded(wanted: str, why: str) -> Route:
    r = _DEGRADED.get((wanted, why))
    if r is None:
        r = _DEGRADED[(wanted, why)] = Route(Tier.LIGHT, f"{wanted}:degraded_{why}", degraded=True)
    return r


def should_escalate(confidence: float, escalate_below: float) -> bool:
    """A light answer this unsure goes to the heavy tier instead of the customer."""
    return confidence < escalate_below


def in_sample(request_id: str, rate: float) -> bool:
    """Deterministic per-id sampling (shadow traffic): the same id is always in or out."""
    if rate <= 0.0:
        return False
    return (zlib.crc32(request_id.encode()) & 0xFFFF) < rate * 0x10000

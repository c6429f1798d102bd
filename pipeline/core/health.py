"""Pure health assessment of the heavy tier with hysteresis: when to degrade and when to recover.

Unhealthy as soon as one signal breaches (lag over `degrade_lag`, p95 over the SLO, no live worker);
healthy again only after every signal has stayed under its recovery level for `recover_after_s` (at once when
the breach was that no worker was up: workers coming up are not an overload easing off).
The gap between the breach and recovery levels, plus the dwell time, is what stops flapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.routing import TierHealth


@dataclass(frozen=True, slots=True)
class Observation:
    """What the heartbeats of one tier's workers say right now."""

    workers: int
    lag: int  # messages behind, summed over the tier's partitions
    p95_ms: float  # worst worker's recent p95, received -> produced


@dataclass(frozen=True, slots=True)
class HealthLimits:
    slo_p95_ms: float
    degrade_lag: int
    recover_ratio: float  # recover when lag and p95 are below this share of their limits
    recover_after_s: float


@dataclass(frozen=True, slots=True)
class HealthState:
    health: TierHealth
    calm_since: float | None = None  # when every signal last went below its recovery level


def breach(obs: Observation, lim: HealthLimits) -> str | None:
    """The first signal over its limit, or None."""
    if obs.workers == 0:
        return "no_workers"
    if obs.lag > lim.degrade_lag:
        return "lag"
    if obs.p95_ms > lim.slo_p95_ms:
        return "slow"
    return None


def calm(obs: Observation, lim: HealthLimits) -> bool:
    return (
        obs.workers > 0
        and obs.lag <= lim.degrade_lag * lim.recover_ratio
        and obs.p95_ms <= lim.slo_p95_ms * lim.recover_ratio
    )


def assess(prev: HealthState, obs: Observation, lim: HealthLimits, now: float) -> HealthState:
    """The next health state from the previous one and a fresh observation at time `now` (seconds)."""
    why = breach(obs, lim)
    if why is not None:
        return HealthState(TierHealth(False, why), None)
    if prev.health.heavy_ok:
        return prev
    if not calm(obs, lim):
        return HealthState(prev.health, None)
    if prev.health.reason == "no_workers":
        # A worker coming up (or ingest starting before its workers) is not an overload easing off: no dwell, or
        # the first seconds of every start would send heavy-bound traffic to light.
        return HealthState(TierHealth(True, "ok"), None)
    since = prev.calm_since if prev.calm_since is not None else now
    if now - since >= lim.recover_after_s:
        return HealthState(TierHealth(True, "ok"), None)
    return HealthState(prev.health, since)

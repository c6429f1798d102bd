"""Pure health assessment of the heavy tier with hysteresis: when to degrade and when to recover.

Unhealthy as soon as one signal breaches (lag over `degrade_lag`, p95 over the SLO, no ready worker);
healthy again only after every signal has stayed under its recovery level for `recover_after_s` (at once when
the breach was that no worker was up: workers coming up are not an overload easing off).
The gap between the breach and recovery levels, plus the dwell time, is what stops flapping.

A start-up in progress is not a breach: while a worker says it is starting (loading its model, joining its group)
for less than `startup_s`, a tier without ready workers keeps its verdict. At a stack's start every agent comes
up together; sending heavy-bound requests to light until the heavy model has loaded would answer the first
minute's hard questions with the light model, while the heavy topic would have queued them for seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.core.routing import TierHealth
from pipeline.core.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class Observation:
    """What the heartbeats of one tier's workers say right now."""

    workers: int  # ready ones: model loaded, partitions assigned
    lag: int  # messages behind, summed over the tier's partitions
    p95_ms: float  # worst worker's recent p95, received -> produced
    starting_s: float | None = None  # how long the youngest worker that is not ready yet has been starting


@dataclass(frozen=True, slots=True)
class HealthLimits:
    slo_p95_ms: float
    degrade_lag: int
    recover_ratio: float  # recover when lag and p95 are below this share of their limits
    recover_after_s: float
    startup_s: float = 300.0  # how long a starting worker stands for a ready one


@dataclass(frozen=True, slots=True)
class HealthState:
    health: TierHealth
    calm_since: float | None = None  # when every signal last went below its recovery level


def heavy_limits(th: Thresholds, startup_s: float) -> HealthLimits:
    """The heavy tier's limits from the thresholds: ingest degrades by them, the controller calls heavy healthy by
    the same rule."""
    return HealthLimits(th.heavy_slo_p95_ms, th.degrade_lag, th.recover_ratio, th.recover_after_s, startup_s)


def breach(obs: Observation, lim: HealthLimits) -> str | None:
    """The first signal over its limit, or None."""
    if obs.workers == 0:
        return None if starting(obs, lim) else "no_workers"
    if obs.lag > lim.degrade_lag:
        return "lag"
    if obs.p95_ms > lim.slo_p95_ms:
        return "slow"
    return None


def starting(obs: Observation, lim: HealthLimits) -> bool:
    """A worker is starting, and has not taken longer than a start may take."""
    return obs.starting_s is not None and obs.starting_s < lim.startup_s


def at_own_start(obs: Observation, own_age_s: float, announce_s: float) -> Observation:
    """The observation of a reader (ingest) that started `own_age_s` ago: with no worker heard of yet, the tier's
    workers may be starting with it and not have announced themselves; they count as starting for `announce_s`."""
    if obs.workers or obs.starting_s is not None or own_age_s >= announce_s:
        return obs
    return replace(obs, starting_s=own_age_s)


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

"""Heavy-tier health with hysteresis: degrade at once, recover only after a calm dwell time."""

from __future__ import annotations

from pipeline.core.health import HealthLimits, HealthState, Observation, assess, at_own_start
from pipeline.core.routing import HEALTHY

LIM = HealthLimits(slo_p95_ms=1000, degrade_lag=1000, recover_ratio=0.5, recover_after_s=3.0)


def test_each_signal_degrades() -> None:
    ok = HealthState(HEALTHY)
    assert assess(ok, Observation(0, 0, 0), LIM, 0).health.reason == "no_workers"
    assert assess(ok, Observation(1, 1001, 0), LIM, 0).health.reason == "lag"
    assert assess(ok, Observation(1, 0, 1500), LIM, 0).health.reason == "slow"
    assert assess(ok, Observation(1, 900, 900), LIM, 0).health.heavy_ok


def test_recovery_needs_calm_for_the_dwell_time() -> None:
    st = assess(HealthState(HEALTHY), Observation(1, 0, 2000), LIM, 0.0)
    assert not st.health.heavy_ok
    # Under the SLO but above the recovery level: still degraded (no flapping at the boundary).
    st = assess(st, Observation(1, 0, 900), LIM, 1.0)
    assert not st.health.heavy_ok
    st = assess(st, Observation(1, 0, 400), LIM, 2.0)
    assert not st.health.heavy_ok
    st = assess(st, Observation(1, 0, 400), LIM, 4.0)
    assert not st.health.heavy_ok
    st = assess(st, Observation(1, 0, 400), LIM, 5.0)
    assert st.health.heavy_ok


def test_a_relapse_restarts_the_dwell_time() -> None:
    st = assess(HealthState(HEALTHY), Observation(1, 5000, 0), LIM, 0.0)
    st = assess(st, Observation(1, 10, 10), LIM, 1.0)
    st = assess(st, Observation(1, 800, 10), LIM, 2.0)  # not calm: above recovery level
    st = assess(st, Observation(1, 10, 10), LIM, 3.5)
    assert not st.health.heavy_ok
    st = assess(st, Observation(1, 10, 10), LIM, 6.5)
    assert st.health.heavy_ok


def test_oscillating_signal_does_not_flap() -> None:
    st = HealthState(HEALTHY)
    flips, prev = 0, True
    for i in range(100):
        p95 = 1100 if i % 2 else 950  # hovering around the SLO
        st = assess(st, Observation(1, 0, p95), LIM, i * 0.5)
        if st.health.heavy_ok != prev:
            flips += 1
            prev = st.health.heavy_ok
    assert flips == 1


def test_workers_appearing_are_healthy_at_once() -> None:
    """Workers coming up (ingest started first, a worker restarted) need no dwell; an overload easing off does."""
    st = assess(HealthState(HEALTHY), Observation(0, 0, 0), LIM, 0.0)
    assert st.health.reason == "no_workers"
    assert assess(st, Observation(1, 0, 10), LIM, 0.1).health.heavy_ok
    assert not assess(st, Observation(1, 900, 10), LIM, 0.1).health.heavy_ok  # a backlog is not calm


def test_a_start_up_in_progress_keeps_the_tier_healthy_until_it_takes_too_long() -> None:
    lim = HealthLimits(slo_p95_ms=1000, degrade_lag=1000, recover_ratio=0.5, recover_after_s=3.0, startup_s=60.0)
    ok = HealthState(HEALTHY)
    # the stack's start: the heavy worker is loading its model; its traffic waits in the heavy topic
    assert assess(ok, Observation(0, 0, 0, starting_s=5.0), lim, 0).health.heavy_ok
    # a start that hangs is no worker
    assert assess(ok, Observation(0, 0, 0, starting_s=61.0), lim, 0).health.reason == "no_workers"
    # heavy died, its replacement is starting: still degraded until the replacement is ready
    down = assess(ok, Observation(0, 0, 0), lim, 0)
    assert not assess(down, Observation(0, 0, 0, starting_s=1.0), lim, 1).health.heavy_ok
    assert assess(down, Observation(1, 0, 0), lim, 2).health.heavy_ok


def test_a_reader_that_just_started_waits_for_workers_to_announce_themselves() -> None:
    nobody = Observation(0, 0, 0)
    assert at_own_start(nobody, own_age_s=2.0, announce_s=15.0).starting_s == 2.0
    assert at_own_start(nobody, own_age_s=16.0, announce_s=15.0) == nobody
    # workers heard of: what they say stands
    assert at_own_start(Observation(1, 0, 0), 2.0, 15.0) == Observation(1, 0, 0)
    assert at_own_start(Observation(0, 0, 0, starting_s=9.0), 2.0, 15.0).starting_s == 9.0

"""Redis key names are a wire contract: a running stack's data, dashboards and runbooks name them."""

from __future__ import annotations

from pipeline.contracts.keys import Keys


def test_the_key_names_are_those_a_running_stack_already_has() -> None:
    k = Keys("tierflow:")
    assert (k.thresholds, k.thresholds_history, k.thresholds_changed) == (
        "tierflow:thresholds", "tierflow:thresholds:history", "tierflow:thresholds:changed")
    assert (k.vip, k.vip_changed) == ("tierflow:vip", "tierflow:vip:changed")
    assert k.heartbeat("heavy", "w-1") == "tierflow:hb:heavy:w-1" and k.heartbeats("heavy") == "tierflow:hb:heavy:*"
    assert k.fault_latency("light") == "tierflow:fault:latency_ms:light"
    assert k.feedback_state == "tierflow:feedback:state"
    assert (k.replay_answered, k.replay_job("j1")) == ("tierflow:replay:answered", "tierflow:replay:job:j1")
    assert k.transactional_id("tierflow-worker-light-0") == "tierflow:tx:tierflow-worker-light-0"
    assert Keys("stack2:").vip == "stack2:vip"

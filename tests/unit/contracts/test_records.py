"""The heartbeat record: one builder, one reader, every field present and of its type."""

from __future__ import annotations

import orjson
import pytest

from pipeline.adapters.heartbeats import observation
from pipeline.contracts.records import dump_heartbeat, heartbeat, heartbeat_of


def test_the_builder_fills_every_field_and_refuses_unknown_ones() -> None:
    hb = heartbeat(worker="w1", tier="heavy", lag=3, live_p95_ms=12.5, ready=True)
    assert hb["busy_ms"] == 0.0 and hb["model"] == "?" and hb["lag"] == 3 and hb["ready"] is True
    with pytest.raises(TypeError, match="unknown fields \\['lagg'\\]"):
        heartbeat(lagg=3)


def test_the_reader_takes_what_older_writers_wrote_and_refuses_what_is_not_a_heartbeat() -> None:
    old = orjson.dumps({"ts": 1.5, "worker": "w0", "lag": "7", "p95_ms": 40})  # before busy_ms and live_p95_ms
    hb = heartbeat_of(old)
    assert hb is not None
    assert (hb["lag"], hb["p95_ms"], hb["busy_ms"], hb["live_p95_ms"], hb["ready"]) == (7, 40.0, 0.0, 0.0, False)
    assert heartbeat_of(dump_heartbeat(heartbeat(busy_ms=900.0))) == heartbeat(busy_ms=900.0)
    for junk in (b"", b"not json", b"[1, 2]", b'{"lag": "many"}'):
        assert heartbeat_of(junk) is None


def test_the_tier_observation_takes_the_worst_live_p95_or_batch_in_hand() -> None:
    beats = [heartbeat(lag=5, live_p95_ms=100.0, p95_ms=9000.0), heartbeat(lag=2, live_p95_ms=80.0, busy_ms=650.0)]
    obs = observation(beats)
    # a replay's slow answers (p95_ms) are not the live SLO's; the second worker's batch in hand is
    assert (obs.workers, obs.lag, obs.p95_ms) == (2, 7, 650.0)
    assert observation([]).workers == 0

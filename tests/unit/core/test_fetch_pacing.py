"""The pacing of a consumer on a broker that answers empty fetches at once: hot while records flow, resting after."""

from __future__ import annotations

from pipeline.core.fetch_pacing import FetchPacer, behind_ends


def test_a_consumer_stays_hot_while_records_flow_and_rests_after_the_quiet_period() -> None:
    p = FetchPacer(rest_after_s=0.5, first_s=0.002, max_s=0.05)
    p.got(10.0)
    assert not p.should_rest(10.4) and abs(p.hot_left_s(10.4) - 0.1) < 1e-9
    assert p.should_rest(10.5)
    p.rest(10.5)
    assert p.resting and not p.should_rest(11.0) and p.hot_left_s(11.0) == 0.0


def test_probes_back_off_to_the_cap_and_records_make_it_hot_again() -> None:
    p = FetchPacer(rest_after_s=0.5, first_s=0.002, max_s=0.05)
    p.got(0.0)
    p.rest(1.0)
    assert not p.probe_due(1.001) and p.probe_due(1.002)
    now, gaps = 1.002, []
    for _ in range(8):
        p.probed(now)
        gaps.append(round(p.wait_s(now), 4))
        now += p.wait_s(now)
    assert gaps == [0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.05, 0.05]  # a lone record waits at most max_s
    p.got(now)
    assert not p.resting and p.wait_s(now) == 0.0
    p.rest(now + 0.5)
    assert abs(p.wait_s(now + 0.5) - 0.002) < 1e-9  # a new rest starts from the shortest interval again


def test_a_consumer_woken_for_records_stays_hot_until_they_come_or_the_hold_ends() -> None:
    """The fetch a wake resumes may take longer than rest_after_s to come back (a backed-off fetch: 200 ms):
    resting before it did dropped it, and the next probe woke the consumer for the same records."""
    p = FetchPacer(rest_after_s=0.002, hold_s=2.0)
    p.rest(0.0)
    p.expect(1.0)
    assert not p.resting and not p.should_rest(1.3) and abs(p.hot_left_s(1.3) - 1.7) < 1e-9
    assert p.should_rest(3.0)  # nothing came: rest again (the periodic look is the safety net)
    p.expect(4.0)
    p.got(4.25)  # they came: back to the short rest after the last record
    assert not p.should_rest(4.251) and p.should_rest(4.252)


def test_a_ring_for_another_member_keeps_the_consumer_resting_but_probes_from_the_shortest_interval() -> None:
    p = FetchPacer(first_s=0.004, max_s=0.1)
    p.rest(0.0)
    for now in (0.004, 0.012, 0.028, 0.06):
        p.probed(now)
    p.soon(0.07)
    assert p.resting and abs(p.wait_s(0.07) - 0.004) < 1e-9
    hot = FetchPacer()
    hot.got(0.0)
    hot.soon(0.1)
    assert not hot.resting and hot.wait_s(0.1) == 0.0


def test_the_periodic_look_comes_every_recheck_s() -> None:
    p = FetchPacer(recheck_s=2.0)
    p.rest(0.0)
    assert not p.recheck_due(1.9) and p.recheck_due(2.0)
    p.rechecked(2.0)
    assert not p.recheck_due(3.9) and p.recheck_due(4.0)


def test_behind_when_an_end_is_past_the_next_offset_or_the_position_is_unknown() -> None:
    starts: dict[tuple[str, int], int | None] = {("t", 0): 5, ("t", 1): 7}
    assert not behind_ends({("t", 0): 5, ("t", 1): 7}, starts)
    assert behind_ends({("t", 0): 6, ("t", 1): 7}, starts)
    assert behind_ends({("t", 0): 5, ("t", 1): 7, ("t", 2): 0}, starts)  # assigned since the pause
    assert behind_ends({("t", 0): 0}, {("t", 0): None})


def test_an_application_away_longer_than_a_rest_with_its_records_makes_the_consumer_rest_as_it_goes() -> None:
    """A heavy worker's model batch outlasts a rest: its fetcher looped the whole time; a light one's does not."""
    slow = FetchPacer(rest_after_s=0.005)
    assert not slow.away_long()  # nothing measured yet
    for t in range(5):
        slow.away(t * 1.0)
        slow.called(t * 1.0 + 0.02)  # 20 ms of inference a batch
    assert slow.away_long()
    fast = FetchPacer(rest_after_s=0.005)
    for t in range(5):
        fast.away(t * 1.0)
        fast.called(t * 1.0 + 0.001)
    assert not fast.away_long()
    fast.called(10.0)  # a call without going away first measures nothing
    assert not fast.away_long()


def test_records_further_apart_than_the_hot_window_make_the_consumer_rest_soon_after_each() -> None:
    """At 50 msg/s a record comes every 20 ms: 5 ms hot after each was a fetch loop, on both sides, for a quarter of
    the time, for nothing (measured: 17 -> 11 ms of CPU per answer through `tierflow up`). Close records keep the
    whole window: the next is likely within it, and a fetch is cheaper than a rest and a wake."""
    p = FetchPacer(rest_after_s=0.005, sparse_rest_s=0.0005)
    p.got(0.0)
    assert p.hot_window_s() == 0.005  # one record: nothing known of the gaps yet
    for i in range(1, 4):
        p.got(i * 0.020)
    assert p.hot_window_s() == 0.0005 and p.should_rest(0.0606) and not p.should_rest(0.0604)
    for i in range(1, 8):  # a burst: records a millisecond apart
        p.got(0.060 + i * 0.001)
    assert p.hot_window_s() == 0.005 and not p.should_rest(0.070)
    p.expect(1.0)  # a wake is no arrival: the gaps stay those of the records
    assert p.hot_window_s() == 0.005


def test_while_records_keep_coming_the_looks_stay_within_a_quarter_of_their_gap_then_back_off_when_they_stop() -> None:
    """A producer that does not ring (any client but tierflow's): ingest finds its records by looking. At 50 msg/s the
    doubling (4, 8, 16 ms) had a record wait 7 ms for the look; capped at a quarter of the gap, 2-3 ms."""
    p = FetchPacer(rest_after_s=0.005, sparse_rest_s=0.0005, first_s=0.004, max_s=0.1)
    for i in range(5):
        p.got(i * 0.020)
    p.rest(0.0806)
    now, waits = 0.0806, []
    for _ in range(4):
        now += p.wait_s(now)
        p.probed(now)
        waits.append(round(p.wait_s(now), 4))
    assert waits == [0.005, 0.005, 0.005, 0.005]  # a quarter of the 20 ms gap
    now = 0.080 + 4 * 0.020  # four gaps without a record: traffic has stopped, the looks back off again
    p.probed(now)
    assert round(p.wait_s(now), 4) == 0.01
    p.probed(now + 0.01)
    assert round(p.wait_s(now + 0.01), 4) == 0.02


def test_after_a_long_quiet_a_new_stream_pace_is_learnt_within_a_few_records() -> None:
    p = FetchPacer(rest_after_s=0.005, sparse_rest_s=0.0005, first_s=0.004, max_s=0.1)
    p.got(0.0)
    p.got(3600.0)  # an idle hour counts as one second
    now = 3600.0
    for _ in range(10):
        now += 0.020
        p.got(now)
    p.rest(now + 0.001)
    t, waits = now + 0.001, []
    for _ in range(5):
        t += p.wait_s(t)
        p.probed(t)
        waits.append(p.wait_s(t))
    # the average gap is ~48 ms after ten records (the hour counted as a second): looks within 12 ms of each other,
    # where an hour counted in full would have let them double up to max_s (100 ms)
    assert max(waits) < 0.012 and waits[-1] > 0.011


def test_where_records_come_far_apart_a_short_batch_is_away_long_enough_to_rest() -> None:
    """At 50 msg/s a light worker's predict, produce and commit of a record take 1-3 ms: more than the 0.5 ms it
    stays hot after sparse records, so its fetcher looped all that while (12 fetches a message on both sides,
    measured with strace through `tierflow up`; 3.5 once it rested as it went)."""
    p = FetchPacer(rest_after_s=0.005, sparse_rest_s=0.0005)
    for i in range(4):
        p.got(i * 0.020)
        p.away(i * 0.020)
        p.called(i * 0.020 + 0.002)  # 2 ms away with each record
    assert p.hot_window_s() == 0.0005 and p.away_long()
    for i in range(1, 30):  # a burst: records a millisecond apart, the same 2 ms away
        p.got(0.1 + i * 0.001)
        p.away(0.1 + i * 0.001)
        p.called(0.1 + i * 0.001 + 0.002)
    assert p.hot_window_s() == 0.005 and not p.away_long()  # the next record is likely nearer than a rest and a wake


def test_where_every_writer_rings_a_resting_consumer_looks_only_as_a_safety_net() -> None:
    """A tier topic: ingest and the light workers ring it after each write, so a record wakes its consumer at once;
    looks from 4 ms up (three between two records at 50 msg/s) were a ListOffsets each on both sides for nothing."""
    p = FetchPacer(rest_after_s=0.005, sparse_rest_s=0.0005, first_s=0.004, max_s=0.1, rung=True)
    for i in range(5):
        p.got(i * 0.020)
    p.rest(0.0806)
    assert round(p.wait_s(0.0806), 4) == 0.1
    p.probed(0.1806)
    assert round(p.wait_s(0.1806), 4) == 0.1  # no quarter-of-the-gap looks either
    p.soon(0.2)  # a ring for another member's partition: the next write rings again
    assert round(p.wait_s(0.2), 4) == 0.1

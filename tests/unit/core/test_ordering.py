"""GapGuard: a record past its partition's expected offset is held back and re-read, until the gap fills in
or stays for the grace period."""

from __future__ import annotations

from pipeline.core.ordering import GapGuard

P = ("t", 0)


def test_in_order_records_go_through() -> None:
    g = GapGuard()
    assert [g.admit(P, o, 0.0) for o in range(5)] == [None] * 5
    assert (g.healed, g.passed) == (0, 0)


def test_the_first_record_of_a_partition_sets_where_it_starts() -> None:
    g = GapGuard()
    assert g.admit(P, 1000, 0.0) is None  # a committed offset, a seek: wherever the consumer starts
    assert g.admit(P, 1001, 0.0) is None


def test_a_record_past_a_gap_is_held_and_its_partition_read_again_from_the_gap() -> None:
    g = GapGuard(grace_s=2.0)
    g.admit(P, 10, 0.0)
    assert g.admit(P, 13, 0.1) == 11  # 11 and 12 not shown yet: read again from 11
    assert g.admit(P, 13, 0.2) == 11  # still not there: held again
    assert g.admit(P, 11, 0.3) is None  # the broker shows them now
    assert g.admit(P, 12, 0.3) is None
    assert g.admit(P, 13, 0.3) is None
    assert (g.healed, g.passed) == (1, 0)


def test_a_gap_that_stays_past_the_grace_is_passed() -> None:
    g = GapGuard(grace_s=2.0)
    g.admit(P, 10, 0.0)
    assert g.admit(P, 12, 1.0) == 11
    assert g.admit(P, 12, 2.9) == 11
    assert g.admit(P, 12, 3.0) is None  # 2 s with the same gap: a transaction marker, a write given up
    assert g.admit(P, 13, 3.0) is None
    assert (g.healed, g.passed) == (0, 1)


def test_a_different_gap_starts_its_own_grace() -> None:
    g = GapGuard(grace_s=2.0)
    g.admit(P, 10, 0.0)
    assert g.admit(P, 12, 0.0) == 11
    assert g.admit(P, 14, 1.9) == 11  # 11 still missing, a later record shown: a new gap, its own clock
    assert g.admit(P, 14, 3.0) == 11
    assert g.admit(P, 14, 3.9) is None


def test_partitions_are_guarded_apart() -> None:
    g = GapGuard()
    g.admit(("t", 0), 5, 0.0)
    g.admit(("t", 1), 5, 0.0)
    assert g.admit(("t", 0), 7, 0.0) == 6
    assert g.admit(("t", 1), 6, 0.0) is None
    assert g.admit(("u", 0), 99, 0.0) is None


def test_a_move_back_is_followed_and_forget_starts_over() -> None:
    g = GapGuard()
    g.admit(P, 10, 0.0)
    assert g.admit(P, 4, 0.0) is None  # a rewind: the batch is read again
    assert g.admit(P, 5, 0.0) is None
    g.forget([P])  # assigned again: its committed offset may be ahead of what this consumer read
    assert g.admit(P, 50, 0.0) is None
    g.admit(P, 52, 0.0)
    g.forget()
    assert g.admit(P, 52, 0.0) is None

"""bench.side_by_side: the judge never sees which reply is written, and the verdicts are unblinded right."""

from __future__ import annotations

import pytest

from bench.side_by_side import blind, score

ROWS = [
    {"id": "check-001", "lang": "en", "message": "m1", "policy": "P1", "A": "written 1", "B": "P1", "key": "A"},
    {"id": "check-002", "lang": "zh", "message": "m2", "policy": "P2", "A": "P2", "B": "written 2", "key": "B"},
    {"id": "check-003", "lang": "en", "message": "m|3", "policy": "P3", "A": "P3", "B": "written 3", "key": "B"},
]


def test_the_judge_s_file_has_no_key() -> None:
    assert all("key" not in r and {"A", "B", "policy", "message"} <= set(r) for r in blind(ROWS))


def test_verdicts_are_unblinded_by_the_key() -> None:
    body = score(ROWS, {"check-001": {"better": "A", "why": "names the order"},
                        "check-002": {"better": "A", "why": "complete"},
                        "check-003": {"better": "same"}})
    assert "Written reply more helpful: **1** of 3; template more helpful: 1; the same: 1." in body
    assert "| check-001 | en | m1 | written 1 | P1 | written | names the order |" in body
    assert "| check-002 | zh | m2 | written 2 | P2 | template | complete |" in body
    assert "| check-003 | en | m/3 |" in body  # a table cell cannot hold a bar


def test_a_missing_verdict_is_one_line_naming_the_pair() -> None:
    with pytest.raises(SystemExit, match=r"no verdict .* for check-002, check-003"):
        score(ROWS, {"check-001": {"better": "A"}, "check-002": {"better": "maybe"}})

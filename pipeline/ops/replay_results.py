"""What `tierflow replay --wait` shows: the replay's results, read back, and their accuracy where labelled."""

from __future__ import annotations

import time
from collections import Counter

from pipeline.adapters.kafka import Tail
from pipeline.contracts.records import Result, result_of


def wait_for_results(tail: Tail, ids: set[str], timeout_s: float, shadow: bool) -> list[Result]:
    """The results of a replay's requests (final ones, or both shadow stages), read from tierflow.results by a
    Tail taken before the replay sent anything (so none can be missed)."""
    want = len(ids) * (2 if shadow else 1)
    out: list[Result] = []
    deadline = time.monotonic() + timeout_s
    seen: set[tuple[str, str]] = set()
    try:
        while len(seen) < want and time.monotonic() < deadline:
            for m in tail.poll(0.5):
                res = result_of(m.value())
                if res is None:
                    continue
                rid = res.get("request_id")
                if rid not in ids or not res.get("replay"):
                    continue
                if (res.get("shadow") if shadow else res.get("final")):
                    k = (rid, res.get("stage", ""))
                    if k not in seen:
                        seen.add(k)
                        out.append(res)
    finally:
        tail.close()
    return out


def accuracy_table(results: list[Result]) -> str:
    """Accuracy per tier (or per stage for shadow results) where a label exists."""
    total: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for res in results:
        if res.get("label"):
            stage = res["stage"]
            total[stage] += 1
            right[stage] += res["intent"] == res["label"]
    lines = [f"{'tier':<12}{'labelled':>10}{'accuracy':>10}"]
    for k in sorted(total):
        lines.append(f"{k:<12}{total[k]:>10}{right[k] / total[k]:>10.1%}")
    if total:
        lines.append(f"{'all':<12}{sum(total.values()):>10}{sum(right.values()) / sum(total.values()):>10.1%}")
    return "\n".join(lines)

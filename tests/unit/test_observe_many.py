"""metrics.observe_many: the batched histogram path must expose exactly what observe() one by one does."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from pipeline.metrics import observe_many


def samples(h: Histogram) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("le", "")): s.value for m in h.collect() for s in m.samples
            if not s.name.endswith("_created")}


def test_observe_many_matches_observe() -> None:
    rnd = random.Random(3)
    values = [rnd.choice([0.0, 0.001, 0.0025, 0.003, 1.0, 29.0, 31.0, 1e9]) * rnd.random() for _ in range(500)]
    values += [0.0005, 0.001, 30.0]  # exactly on bucket bounds: le is inclusive
    one = Histogram("one", "", ["t"], registry=CollectorRegistry(),
                    buckets=(0.0005, 0.001, 0.0025, 0.01, 1.0, 30.0))
    many = Histogram("one", "", ["t"], registry=CollectorRegistry(),
                     buckets=(0.0005, 0.001, 0.0025, 0.01, 1.0, 30.0))
    for v in values:
        one.labels("a").observe(v)
    observe_many(many.labels("a"), values[:100])
    observe_many(many.labels("a"), values[100:])
    observe_many(many.labels("a"), [])
    got, want = samples(many), samples(one)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert abs(got[k] - v) < 1e-6 * max(1.0, abs(v)), k

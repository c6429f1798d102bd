"""The routing rules and the controller's share model are one contract: the controller predicts how much text
traffic the rules send heavy, so a rule `route()` gains must be modelled there too (house review P10)."""

from __future__ import annotations

import itertools
import random

from pipeline.core.controller import rule_share
from pipeline.core.routing import TierHealth, route
from pipeline.core.stats import AggConfig, Aggregator, Observed

# The rules the share model knows: text goes heavy by VIP or length, else light; images are not text traffic.
MODELLED = {"image", "short", "vip", "length"}
BASE = {"chars": 30, "tokens": 8, "script": "en", "lang": "en", "has_image": False, "image_bytes": 0, "vip": False,
        "question": False, "complaint": False, "urgent": False}


def test_route_returns_only_the_rules_the_share_model_knows() -> None:
    # Every combination of the boolean features (a new rule reads one of them, or a new one added to BASE), at
    # short and long lengths, the heavy tier healthy or not.
    flags = [k for k, v in BASE.items() if isinstance(v, bool)]
    reasons = set()
    for bits in itertools.product((False, True), repeat=len(flags)):
        for chars in (1, 49, 50, 51, 400, 5000):
            for health in (TierHealth(), TierHealth(False, "lag"), TierHealth(False, "slow")):
                r = route({**BASE, **dict(zip(flags, bits, strict=True)), "chars": chars}, 50, health)
                reasons.add(r.reason.split(":")[0])
    assert reasons <= MODELLED, f"route() has rules the controller's share model does not: {reasons - MODELLED}"
    assert reasons == MODELLED


def test_the_share_model_predicts_what_route_sends_heavy() -> None:
    rnd = random.Random(3)
    agg = Aggregator(AggConfig(window_ms=60_000, hop_ms=1_000))
    feats = []
    for i in range(6000):
        f = {**BASE, "chars": max(1, int(rnd.lognormvariate(3.7, 0.7))), "vip": rnd.random() < 0.05,
             "question": rnd.random() < 0.5, "complaint": rnd.random() < 0.2, "urgent": rnd.random() < 0.1}
        feats.append(f)
        tier = "light" if route(f, 50).tier.value == "light" else "heavy"
        agg.observe(Observed(f"r{i}", tier, "m", "x", 0.9, True, False, False, False, 1, 1_000 + i, 10.0, 1.0, 1.0,
                             8, f["chars"], f["vip"], None), 1_000 + i)
    w = agg.window(10_000)
    for threshold in (20, 50, 80, 150):
        routed = sum(route(f, threshold).tier.value == "heavy" for f in feats) / len(feats)
        assert abs(rule_share(w, threshold) - routed) < 0.03, (threshold, rule_share(w, threshold), routed)

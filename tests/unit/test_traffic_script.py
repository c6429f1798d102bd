"""deploy/traffic.py: its mix is valid request.v1 in the documented shares; it publishes to a real broker."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable

import orjson
import pytest

from pipeline.adapters.kafka import topics_of
from pipeline.settings import Settings
from schemas import validator
from tests.unit.test_deploy import ROOT

spec = importlib.util.spec_from_file_location("traffic", ROOT / "deploy" / "traffic.py")
assert spec is not None and spec.loader is not None
traffic = importlib.util.module_from_spec(spec)
sys.modules["traffic"] = traffic
spec.loader.exec_module(traffic)


def test_the_mix_is_valid_requests_in_the_documented_shares() -> None:
    en, zh = traffic.texts()
    assert len(en) > 800 and len(zh) > 100
    reqs = traffic.mix(4000, en, zh, photos=[traffic.photo_png("ORDER 12345")])
    check = validator("request")
    for i, r in enumerate(reqs):
        check.validate({**r, "id": f"r{i}", "ts": 1})
    photos = sum(1 for r in reqs if "image" in r) / len(reqs)
    chinese = sum(1 for r in reqs if r.get("lang") == "zh") / len(reqs)
    assert abs(photos - 0.05) < 0.015 and abs(chinese - 0.20) < 0.025, (photos, chinese)
    assert traffic.mix(50, en, zh) == traffic.mix(50, en, zh)  # seeded: the same run twice


@pytest.mark.integration
def test_it_publishes_at_the_rate_to_the_requests_topic(settings_factory: Callable[..., Settings]) -> None:
    from tests.integration.helpers import drain, reader

    s = settings_factory()
    out = subprocess.run([sys.executable, str(ROOT / "deploy" / "traffic.py"), "--rate", "40", "--seconds", "1"],
                         env={**os.environ, **s.with_env()}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"sent 40 messages to {topics_of(s).requests}" in out.stdout
    got = [orjson.loads(m.value() or b"") for m in drain(reader(s, topics_of(s).requests), lambda ms: len(ms) >= 40,
                                                         timeout=30)]
    assert len(got) == 40 and len({r["id"] for r in got}) == 40 and all(r["ts"] > 0 for r in got)

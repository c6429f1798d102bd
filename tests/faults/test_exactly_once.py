"""Exactly-once mode under kill -9: workers commit answers and offsets in one transaction, and a read_committed
consumer of the answers topic sees exactly one answer per request id, with no deduplication.

Proven only on a broker whose transactions work (Apache Kafka, the embedded noida). tansu shows aborted
transactions to read_committed consumers (measured: a producer killed inside a transaction, restarted with the
same transactional id: its aborted record is still read), so there the mode cannot hold and the test says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from pipeline.adapters.brokers import EmbeddedBroker
from pipeline.settings import Settings
from tests.faults.conftest import Reliability
from tests.faults.harness import Agents, Observer, RssSampler, Traffic, trace, verify
from tests.integration.helpers import wait_ready

pytestmark = pytest.mark.integration

TIERS = ["light", "heavy", "multimodal"]
PIPELINE = ("ingest", "worker-light", "worker-heavy", "worker-multimodal")
KILLS = ("worker-light", "worker-heavy", "worker-light")


def test_exactly_once_survives_worker_kills(settings_factory: Callable[..., Settings], broker: EmbeddedBroker | None,
                                            reliability: Reliability) -> None:
    if broker is not None and not broker.traits.read_committed:
        pytest.skip(f"{broker.name}: read_committed consumers are shown aborted transactions, so exactly-once "
                    "cannot hold on it (pipeline/adapters/brokers.py)")
    s = settings_factory(exactly_once=True)
    agents = Agents(s, env={"TIERFLOW_EXACTLY_ONCE": "true"}).start(*PIPELINE)
    total, rate = 20_000, 1000.0
    try:
        wait_ready(s, TIERS)
        with Observer(s) as obs:  # librdkafka's default isolation.level: read_committed
            traffic = Traffic(s, "eos", total, rate, mix=(("light", 0.6), ("heavy", 0.4)))
            killed = []
            with RssSampler(agents.pids) as rss, traffic:
                for name in KILLS:
                    time.sleep(traffic.duration_s / (len(KILLS) + 1))
                    agents.kill(name)  # kill -9, mid-transaction at this rate
                    killed.append(name)
                    agents.start(name)  # the same transactional id: its first init aborts what was left open
                traffic.wait(traffic.duration_s + 120)
            waited = obs.wait_for(traffic.sent, timeout=240, settle_s=5.0)
        verdict = verify(traffic.sent, obs, duplicate_bound=0)
        reliability.record(
            fault=f"kill -9 of a worker {len(KILLS)} times, exactly-once mode",
            variant="short", load=f"{verdict.sent_valid:,} requests at {rate:.0f}/s",
            invariants={"0 lost": not verdict.lost, "0 duplicate answers (no deduplication)": verdict.duplicates == 0,
                        "nothing dead-lettered": not verdict.valid_dead},
            counts={"sent": verdict.sent_valid, "answered": verdict.answered, "raw answers": verdict.raw_answers,
                    "duplicates": verdict.duplicates, "lost": len(verdict.lost), "kills": len(killed),
                    "drain s": round(waited, 1)},
            peak_rss_mib=rss.peak_mib(),
            notes="Workers write results, answers and their consumer offsets in one transaction; a restarted worker "
                  "keeps its transactional id (TIERFLOW_WORKER_ID or the host name), so its first init_transactions "
                  "aborts the transaction the killed one left open. The observer reads with isolation.level="
                  "read_committed and counts raw answers.",
        )
        assert verdict.held, (verdict.violations, trace(s, verdict.lost[:3]))
        assert verdict.raw_answers == verdict.answered == verdict.sent_valid
    finally:
        agents.stop()

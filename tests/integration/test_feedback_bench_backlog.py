"""bench.feedback's backlog survives the embedded broker's topic bounds.

The embedded noida keeps 1 MiB a partition and applies the bound as records arrive: the 200,000 results of a full
run lost their oldest 128,000 while the topic was filled, and the agent, having counted the rest, idled until the
round timed out (read as a drain of 120 results/s). Here a few MiB of incompressible records stand in for it.
"""

from __future__ import annotations

import os

import pytest

from bench.common import drop_topics, fresh_topics
from bench.feedback import backlog_topics, check_kept, fill
from pipeline.adapters.kafka import topics_of
from pipeline.settings import Settings

pytestmark = pytest.mark.integration


def backlog(s: Settings) -> int:
    """Twice the embedded bound a partition (1 MiB unless the stack says otherwise), incompressible."""
    per_partition = 2 * (s.topic.retention_bytes or 1 << 20)
    n = s.partitions * per_partition // 1000
    fill(s, topics_of(s).results, [os.urandom(1000) for _ in range(n)])
    return n


def test_the_results_backlog_is_kept_whole(services: Settings) -> None:
    s = backlog_topics(services)
    try:
        n = backlog(s)
        check_kept(s, topics_of(s).results, n)  # all n, from offset 0
    finally:
        drop_topics(s)


def test_a_bounded_results_topic_is_caught_before_the_agent_waits(services: Settings) -> None:
    if services.topic.retention_bytes is None:
        pytest.skip("this broker bounds no topic")
    s = fresh_topics(services)  # what the bench used: every topic bounded
    try:
        n = backlog(s)
        with pytest.raises(SystemExit, match="does not hold"):
            check_kept(s, topics_of(s).results, n)
    finally:
        drop_topics(s)

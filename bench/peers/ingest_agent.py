"""tierflow's own ingest agent (`pipeline.agents.ingest.Ingest`) in a process of its own, as bench/ingest.py runs it.

Settings from the environment the parent passes (`Settings.with_env`: broker, Redis, the round's topic prefix);
`step()` until N requests are consumed: each step consumes a batch, validates, extracts features, routes, produces
the routed envelopes, flushes and commits. Timed from the end of the first batch to the end of the last (work.Meter).

    python -m bench.peers.ingest_agent '<Spec JSON>'    (bench/peers/__main__.py starts it)
"""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.peers.work import Meter, Spec, confluent_versions
from pipeline.agents.ingest import Ingest
from pipeline.settings import Settings


def run(spec: Spec) -> dict[str, Any]:
    s = Settings()
    # The peers route each message alone: tierflow's conversation step (a Redis read per batch of customers'
    # messages, pipeline/core/conversation.py) is off so that all three do the same work and route alike.
    s = s.model_copy(update={"conversation": s.conversation.model_copy(update={"enabled": False})})
    agent = Ingest(s, health_checks=False)
    agent.cache.start()
    agent.consumer.subscribe([agent.topics.requests])
    meter = Meter()
    try:
        while meter.count < spec.messages:
            k = agent.step(timeout=1.0)
            if k:
                meter.add(k)
        t_end = time.perf_counter()
    finally:
        agent.close()
    return meter.report(spec.runner, t_end, library=confluent_versions())


if __name__ == "__main__":
    run(Spec.loads(sys.argv[1]))

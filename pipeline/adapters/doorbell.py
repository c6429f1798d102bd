"""Doorbells: whoever writes a topic rings it (Redis pub/sub) and the topic's resting consumers wake at once.

On a broker that answers empty fetches at once, an idle consumer rests and looks at the log's end at intervals of
up to `TIERFLOW_KAFKA_REST_MAX_MS` (pipeline/core/fetch_pacing.py): a lone record would wait up to that at every
hop. tierflow's own writers ring: `tierflow send` rings the requests topic, ingest the tier topics it routed to, a
light worker the heavy topic it escalated to. A ring is a hint: lost (Redis down, a consumer subscribing late),
the record is found at the next look, as for any other writer's records.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable

import redis

from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import Keys
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def ring(r: redis.Redis, prefix: str, topics: Iterable[str]) -> None:
    """Say that records were written to `topics` (one round trip for all); never raises."""
    keys = Keys(prefix)
    try:
        pipe = r.pipeline(transaction=False)
        for t in topics:
            pipe.publish(keys.wake(t), b"")
        pipe.execute()
    except (redis.RedisError, OSError) as e:
        log.debug("doorbell: %s", e)


class Bell:
    """Listens to the doorbells of `topics` in a thread of its own; `event` is set when one rings."""

    def __init__(self, settings: Settings, topics: Iterable[str]) -> None:
        self.settings = settings
        self.channels = [Keys(settings.redis.prefix).wake(t) for t in topics]
        self.event = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="doorbell", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            pubsub = None
            try:
                pubsub = make_redis(self.settings).pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(*self.channels)
                while not self._stopping.is_set():
                    if pubsub.get_message(timeout=1.0) is not None:
                        self.event.set()
            except (redis.RedisError, OSError) as e:  # Redis down: the consumer still looks at its pace
                log.debug("doorbell: %s", e)
                self._stopping.wait(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(redis.RedisError, OSError):
                        pubsub.close()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2.0)

"""Ingest's work as a Quix Streams application, written the way Quix's docs write one.

`Application(broker_address, consumer_group, auto_offset_reset="earliest")` with its defaults otherwise (commit
every 5 s, at-least-once, librdkafka's producer and consumer settings as Quix sets them); `app.topic()` for the
requests topic (bytes in) and the three tier topics and the DLQ; one `StreamingDataFrame`:
`sdf.apply(route, metadata=True)` calls `work.Router.route` (tierflow's validation, features, routing and
envelope: bench/peers/work.py) on the value, key and timestamp, and `sdf.to_topic(select_topic, key=...)` produces
to the topic it chose (Quix's dynamic topic selection) under the routed key. `app.run(count=N, collect=False)`
stops after N outputs, then Quix commits its last checkpoint (flush, then offsets) and closes.

Timed from the first message's output to the return of `app.run()`, so the last checkpoint's flush is inside.

Runs in its own virtualenv (bench/peers/requirements-quix.txt): quixstreams pins confluent-kafka < 2.13, tierflow
needs >= 2.16.

    <quix-venv>/bin/python -m bench.peers.quix '<Spec JSON>'    (bench/peers/__main__.py starts it)
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from quixstreams import Application
from quixstreams.models import Serializer
from quixstreams.models.serializers import SerializationContext

from bench.peers.work import Meter, Outgoing, Router, Spec, confluent_versions


class OutgoingValue(Serializer):
    """The routed envelope's bytes (the sdf's value is the whole `Outgoing`, so topic and key are at hand)."""

    def __call__(self, value: Outgoing, ctx: SerializationContext) -> bytes:
        return value.value


def run(spec: Spec) -> dict[str, Any]:
    router = Router(spec)
    meter = Meter()
    app = Application(broker_address=spec.bootstrap, consumer_group=spec.group, auto_offset_reset="earliest",
                      loglevel="WARNING")
    requests = app.topic(spec.source, key_deserializer="bytes", value_deserializer="bytes")
    out = {name: app.topic(name, key_serializer="bytes", value_serializer=OutgoingValue())
           for name in (*spec.tiers.values(), spec.dlq)}

    last = [0.0]

    def route(value: bytes, key: bytes | None, timestamp: int, headers: Any) -> Outgoing:
        routed = router.route(value, key, timestamp)
        meter.add()
        if meter.count == spec.messages:
            last[0] = time.perf_counter()
        return routed

    def select_topic(value: Outgoing, key: Any, timestamp: int, headers: Any) -> Any:
        return out[value.topic]

    sdf = app.dataframe(requests)
    sdf = sdf.apply(route, metadata=True)
    sdf.to_topic(select_topic, key=lambda value: value.key)
    app.run(count=spec.messages, collect=False)
    t_end = time.perf_counter()
    return meter.report(spec.runner, t_end, library=_version(), stop_s=t_end - last[0])


def _version() -> str:
    import quixstreams

    return f"{quixstreams.__version__} ({confluent_versions()})"


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run(Spec.loads(sys.argv[1]))

"""Ingest's work as a faust-streaming agent, written the way faust's docs write one.

`faust.App(id, broker="kafka://...", key_serializer="raw", value_serializer="raw")` with its defaults otherwise
(aiokafka, commit every 2.8 s or 10,000 acks), the web server off and no leader topic (`topic_disable_leader`: the
benchmark's topics are made beforehand, nothing else is declared); `app.topic()` for the requests topic, the
three tier topics and the DLQ; one `@app.agent` over the requests topic, `async for event in stream.events()`
(the event gives the key and the record's timestamp as well as the value), `work.Router.route` (tierflow's
validation, features, routing and envelope: bench/peers/work.py), `await topic.send(key=..., value=...)` to the
tier topic it chose. After N messages the agent awaits `app.producer.flush()` and stops the worker.

Timed from the first message's output to the end of that flush.

    python -m bench.peers.faust_ingest '<Spec JSON>'    (bench/peers/__main__.py starts it)
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faust

from bench.peers.work import Meter, Router, Spec


def run(spec: Spec) -> None:
    router = Router(spec)
    meter = Meter()
    datadir = Path(tempfile.mkdtemp(prefix="faust-peer-"))  # faust wants one, even without tables
    app = faust.App(spec.group, broker=f"kafka://{spec.bootstrap}", key_serializer="raw", value_serializer="raw",
                    consumer_auto_offset_reset="earliest", web_enabled=False, topic_disable_leader=True,
                    topic_allow_declare=False, datadir=str(datadir))
    requests = app.topic(spec.source, key_type=bytes, value_type=bytes)
    out = {name: app.topic(name, key_type=bytes, value_type=bytes) for name in (*spec.tiers.values(), spec.dlq)}
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    worker.spinner = None
    version = f"{faust.__version__} (aiokafka {_aiokafka()})"
    stopping: list[asyncio.Future[None]] = []  # a reference to the stop task, so it is not collected

    @app.agent(requests)
    async def ingest(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            ts = event.message.timestamp
            routed = router.route(event.value, event.key, round(ts * 1000) if ts else 0)
            await out[routed.topic].send(key=routed.key, value=routed.value)
            meter.add()
            if meter.count == spec.messages:
                await app.producer.flush()
                meter.report(spec.runner, time.perf_counter(), library=version)
                stopping.append(asyncio.ensure_future(worker.stop()))

    try:
        worker.execute_from_commandline()
    finally:
        shutil.rmtree(datadir, ignore_errors=True)


def _aiokafka() -> str:
    import aiokafka

    return str(aiokafka.__version__)


def main(argv: list[str] | None = None) -> Any:
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("faust", "mode", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return run(Spec.loads((argv or sys.argv)[1]))


if __name__ == "__main__":
    main()

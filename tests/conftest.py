"""Shared fixtures: one real broker and one real Redis per test run, uuid-scoped topics per test.

The embedded broker (TIERFLOW_EMBEDDED_BROKER: noida, the default, or tansu) and a Valkey server are started
once per session on free ports. Point the tests at your own services with TIERFLOW_TEST_BOOTSTRAP /
TIERFLOW_TEST_REDIS_URL instead (the `broker` fixture is then None: a real Kafka gets nothing wrong).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.brokers import EmbeddedBroker, embedded_broker
from pipeline.adapters.kafka import create_topics, delete_topics, topics_of
from pipeline.ops.devstack import Stack, free_port
from pipeline.settings import Settings


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Base settings pointing at a running broker and Redis (embedded unless given)."""
    data_dir = tmp_path_factory.mktemp("stack")
    bootstrap = os.environ.get("TIERFLOW_TEST_BOOTSTRAP")
    redis_url = os.environ.get("TIERFLOW_TEST_REDIS_URL")
    # heavy_generator none: the writer's seconds a reply belong to the tests about it (test_llama, the demo's), not
    # to every test whose stack has a heavy tier.
    base = Settings(kafka_port=free_port(), redis_port=free_port(), data_dir=data_dir,
                    kafka_bootstrap=bootstrap, redis_url=redis_url, heavy_generator="none")
    stack = Stack(base)
    try:
        stack.start_services()
    except BaseException:
        stack.stop()  # a broken embedded stack fails the run loudly: these tests must not be skipped
        raise
    # Children spawned by tests dial these explicitly (with the embedded broker's topic bounds).
    yield stack.settings.updated(kafka_bootstrap=base.kafka.servers, redis_url=base.redis.address)
    stack.stop()


@pytest.fixture(scope="session")
def broker() -> EmbeddedBroker | None:
    """The embedded broker the tests run on (its traits say what it gets wrong), None on your own Kafka."""
    if os.environ.get("TIERFLOW_TEST_BOOTSTRAP"):
        return None
    return embedded_broker(Settings().embedded.broker)


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get("TIERFLOW_TEST_BOOTSTRAP"):
        return f"broker: {os.environ['TIERFLOW_TEST_BOOTSTRAP']} (TIERFLOW_TEST_BOOTSTRAP)"
    return f"broker: embedded {Settings().embedded.broker} (TIERFLOW_EMBEDDED_BROKER)"


@pytest.fixture
def settings_factory(services: Settings) -> Iterator[Callable[..., Settings]]:
    """Settings with fresh topics and Redis keys (uuid prefixes), topics created; deleted after the test.

    Deleting matters on noida: it re-serialises everything it keeps on every write, so topics left behind by
    earlier tests would slow down every later one.
    """
    made: list[Settings] = []

    def make(**overrides: Any) -> Settings:
        tag = uuid.uuid4().hex[:8]
        s = services.updated(topic_prefix=f"t{tag}.", redis_prefix=f"t{tag}:", **overrides)
        create_topics(s)
        made.append(s)
        return s

    yield make
    for s in made:
        # A broker the test killed or replaced has nothing left to clean.
        with contextlib.suppress(Exception):
            delete_topics(s, topics_of(s).all(), timeout=10)


@pytest.fixture
def own_redis(services: Settings, tmp_path: Path) -> Iterator[Stack]:
    """A Redis of the test's own (no persistence): it may be flushed, killed and started again on its port."""
    stack = Stack(services.updated(redis_url=None, redis_port=free_port(), data_dir=tmp_path / "own-redis"))
    stack.start_redis()
    yield stack
    stack.stop()


@dataclass
class Running:
    """Agents running in threads of the test process; `stop()` joins them."""

    threads: list[threading.Thread] = field(default_factory=list)
    agents: list[Any] = field(default_factory=list)

    def start(self, agent: Any) -> Any:
        t = threading.Thread(target=agent.run, daemon=True, name=type(agent).__name__)
        t.start()
        self.threads.append(t)
        self.agents.append(agent)
        return agent

    def stop(self) -> None:
        for a in self.agents:
            a.stop()
        for t in self.threads:
            t.join(30)


@pytest.fixture
def running() -> Iterator[Running]:
    r = Running()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def packaged_models(services: Settings) -> dict[Any, Any]:
    """The real per-tier models from the packaged artefacts, set up once per run (Tier -> model)."""
    from pipeline.contracts.topics import Tier
    from workers.models.registry import tier_model

    models = {t: tier_model(services, t) for t in Tier}
    for m in models.values():
        m.setup("cpu")
    return models

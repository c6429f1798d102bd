"""Settings map onto librdkafka keys; secrets never print; topic names live in one place."""

from __future__ import annotations

import pytest

from pipeline.contracts.topics import Tier, Topics, topic_specs
from pipeline.settings import Settings


def test_env_prefix_and_security_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFLOW_KAFKA_BOOTSTRAP", "k1:9093,k2:9093")
    monkeypatch.setenv("TIERFLOW_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TIERFLOW_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("TIERFLOW_KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("TIERFLOW_KAFKA_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("TIERFLOW_KAFKA_SSL_CA_LOCATION", "/etc/ca.pem")
    monkeypatch.setenv("TIERFLOW_KAFKA_EXTRA", '{"client.id": "tf"}')
    s = Settings()
    conf = s.kafka_config()
    assert conf["bootstrap.servers"] == "k1:9093,k2:9093"
    assert conf["security.protocol"] == "sasl_ssl"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "svc"
    assert conf["sasl.password"] == "hunter2"
    assert conf["ssl.ca.location"] == "/etc/ca.pem"
    assert conf["client.id"] == "tf"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert not s.kafka.embedded


def test_embedded_defaults() -> None:
    s = Settings(_env_file=None)
    assert s.kafka.servers == "127.0.0.1:19092"
    assert s.redis.address == "redis://127.0.0.1:16379/0"
    assert s.kafka.embedded and s.redis.embedded
    assert s.group("ingest") == "tierflow-ingest"
    assert s.group("workers-heavy") == "tierflow-workers-heavy"


def test_topic_names() -> None:
    t = Topics()
    assert t.all()[:8] == ["tierflow.requests", "tierflow.tier.light", "tierflow.tier.heavy",
                           "tierflow.tier.multimodal", "tierflow.results", "tierflow.answers", "tierflow.dlq",
                           "tierflow.labels"]
    assert Topics("acme.").tier(Tier.HEAVY) == "acme.tier.heavy"


def test_topic_specs() -> None:
    specs = topic_specs(Topics(), partitions=6, replication_factor=3)
    control = [s for s in specs if s.name == Topics().control]
    assert [(s.partitions, s.config["cleanup.policy"]) for s in control] == [(1, "compact")]  # one order of facts
    assert all(s.partitions == 6 for s in specs if s.name != Topics().control)
    assert all(s.replication_factor == 3 for s in specs)
    assert all(s.config["min.insync.replicas"] == "2" for s in specs)
    assert all(int(s.config["max.message.bytes"]) >= 5 * 1024 * 1024 for s in specs)

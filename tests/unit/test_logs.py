"""Log lines: JSON one object per line, and no secret ever printed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from pipeline.logs import JsonFormatter, ScrubbingFormatter, ScrubFilter, scrub
from pipeline.settings import Settings


@pytest.fixture
def stream() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tierflow.test.logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, buf
    logger.handlers.clear()


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_one_json_object_per_line(stream: tuple[logging.Logger, io.StringIO]) -> None:
    log, buf = stream
    log.info("routed %d requests to %s", 3, "heavy", extra={"request_id": "req-1"})
    log.warning("multi\nline message")
    first, second = lines(buf)
    assert first["msg"] == "routed 3 requests to heavy"
    assert first["level"] == "INFO" and first["logger"] == "tierflow.test.logs"
    assert first["request_id"] == "req-1"
    assert isinstance(first["ts"], str) and first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["msg"] == "multi\nline message" and "request_id" not in second


def test_exception_text_is_kept(stream: tuple[logging.Logger, io.StringIO]) -> None:
    log, buf = stream
    try:
        raise ValueError("bad batch")
    except ValueError:
        log.exception("worker failed", extra={"request_id": "r9", "tier": "light"})
    (rec,) = lines(buf)
    assert rec["level"] == "ERROR" and rec["request_id"] == "r9" and rec["tier"] == "light"
    assert isinstance(rec["exc"], str) and "Traceback" in rec["exc"] and "ValueError: bad batch" in rec["exc"]


def test_odd_extra_values_do_not_lose_the_line(stream: tuple[logging.Logger, io.StringIO]) -> None:
    log, buf = stream
    log.info("x", extra={"obj": object(), "n": 3, "d": {1: "a"}})
    (rec,) = lines(buf)
    assert rec["n"] == 3 and rec["d"] == {"1": "a"} and str(rec["obj"]).startswith("<object")


@pytest.mark.parametrize(("text", "secret"), [
    ("connecting to redis://default:hunter2@redis:6379/0", "hunter2"),
    ("redis://:s3cr3t@10.0.0.1:6379", "s3cr3t"),
    ("rediss://user:p%40ss@host/1 failed", "p%40ss"),
    ("kafka config {'sasl.password': 'kafkapw', 'sasl.username': 'svc'}", "kafkapw"),
    ('{"sasl.password": "kafkapw2"}', "kafkapw2"),
    ("TIERFLOW_KAFKA_SASL_PASSWORD=envpw", "envpw"),
    ("ssl.key.password=keypw failed", "keypw"),
    ("login with password: letmein", "letmein"),
    ("POST /v1/chat Authorization: Bearer sk-abcdef123", "sk-abcdef123"),
    ("http_api_key=sk-live-1 and more", "sk-live-1"),
    ("url http://bob:pw1@proxy:3128/x", "pw1"),
])
def test_secrets_are_redacted(text: str, secret: str) -> None:
    out = scrub(text)
    assert secret not in out and "***" in out


@pytest.mark.parametrize("text", [
    "redis://127.0.0.1:6379/0",
    "127.0.0.1:19092",
    "tokens=12 max_tokens=64 chars=40",
    "password_file=/run/secrets/kafka",
    "Basic checks passed",
    "user alice@example.com wrote: time 12:30",
    "",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scrub(text) == text


def test_secrets_never_reach_a_json_line(stream: tuple[logging.Logger, io.StringIO]) -> None:
    log, buf = stream
    s = Settings(redis_url="redis://app:redispw@r:6379/0", kafka_sasl_password=SecretStr("kafkapw"),
                 kafka_sasl_username="svc")
    log.warning("dialling %s with %s", s.redis.address, s.kafka_config(), extra={"url": s.redis.address})
    try:
        raise ConnectionError(f"AUTH failed for {s.redis.address}")
    except ConnectionError:
        log.exception("redis down")
    out = buf.getvalue()
    assert "redispw" not in out and "kafkapw" not in out
    first, second = lines(buf)
    assert "redis://app:***@r:6379/0" in str(first["msg"]) and first["url"] == "redis://app:***@r:6379/0"
    assert "'sasl.password': '***'" in str(first["msg"]) and "'sasl.username': 'svc'" in str(first["msg"])
    assert "redis://app:***@r" in str(second["exc"])


def test_plain_text_formatter_scrubs_too() -> None:
    fmt = ScrubbingFormatter("%(levelname)s %(message)s")
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "dial %s", ("redis://:pw@h:1",), None)
    assert fmt.format(rec) == "INFO dial redis://:***@h:1"


def test_filter_scrubs_records_for_foreign_formatters() -> None:
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "dial %s as %s", ("redis://u:pw@h:1", "u"), None)
    assert ScrubFilter().filter(rec)
    assert rec.getMessage() == "dial redis://u:***@h:1 as u"

"""A configuration error of `tierflow` is one line on stderr naming the variable (or flag), the value
and what is expected, with exit code 2 and no traceback; a misspelled TIERFLOW_* variable is a warning.

The CLI runs for real, as a subprocess per case; the cases run concurrently (each is mostly
interpreter start-up), so the file takes about as long as its slowest case.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.errors import ConfigError
from pipeline.settings import Settings, get_settings, settings_error, unknown_env

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    env: dict[str, str]
    argv: tuple[str, ...]
    names: tuple[str, ...]  # what the one stderr line must contain
    code: int = 2


BAD_CSV = "bad-columns.csv"
# {port}: a listening socket standing in for the broker, so `worker` gets as far as loading its model
CASES: dict[str, Case] = {
    "int": Case({"TIERFLOW_PARTITIONS": "abc"}, ("topics", "list"), ("TIERFLOW_PARTITIONS", "'abc'", "integer")),
    "bool": Case({"TIERFLOW_EXACTLY_ONCE": "maybe"}, ("route", "hi"), ("TIERFLOW_EXACTLY_ONCE", "'maybe'", "true")),
    "json": Case({"TIERFLOW_KAFKA_EXTRA": "{bad"}, ("topics", "list"), ("TIERFLOW_KAFKA_EXTRA", "'{bad'", "JSON")),
    "bootstrap": Case({"TIERFLOW_KAFKA_BOOTSTRAP": "localhost"}, ("send", "hi"),
                      ("TIERFLOW_KAFKA_BOOTSTRAP", "'localhost'", "host:port")),
    "log_level": Case({"TIERFLOW_LOG_LEVEL": "LOUD"}, ("route", "hi"),
                      ("TIERFLOW_LOG_LEVEL", "'LOUD'", "DEBUG, INFO, WARNING, ERROR, CRITICAL")),
    "model": Case({"TIERFLOW_LIGHT_MODEL": "nope", "TIERFLOW_KAFKA_BOOTSTRAP": "127.0.0.1:{port}"},
                  ("worker", "--tier", "light"), ("TIERFLOW_LIGHT_MODEL", "'nope'", "charngram")),
    "train_missing": Case({}, ("train", "--data", "/no/such.csv"), ("--data", "/no/such.csv", "text,category")),
    "train_columns": Case({}, ("train", "--data", BAD_CSV), ("--data", BAD_CSV, "text,category")),
    "misspelled": Case({"TIERFLOW_PARTITION": "8"}, ("topics", "list"),
                       ("warning", "TIERFLOW_PARTITION ", "TIERFLOW_PARTITIONS?"), code=0),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    tmp = tmp_path_factory.mktemp("config-errors")
    (tmp / BAD_CSV).write_text("message,label\nhello,greeting\n", encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIERFLOW_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [clean.get("PYTHONPATH")])])
    with socket.socket() as broker:
        broker.bind(("127.0.0.1", 0))
        broker.listen()
        port = broker.getsockname()[1]
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "pipeline.cli", *case.argv], cwd=tmp, text=True,
                env={**clean, **{k: v.replace("{port}", str(port)) for k, v in case.env.items()}},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for name, case in CASES.items()
        }
        out = {}
        for name, p in procs.items():
            try:
                stdout, stderr = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    yield out


@pytest.mark.parametrize("name", list(CASES))
def test_one_line_naming_the_variable_and_value(
        name: str, results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    case, got = CASES[name], results[name]
    assert "Traceback" not in got.stderr, got.stderr
    assert got.returncode == case.code, got.stderr
    lines = got.stderr.rstrip("\n").split("\n")
    assert len(lines) == 1, got.stderr
    assert all(s in lines[0] for s in case.names), lines[0]
    if case.code == 2:
        assert lines[0].startswith(f"tierflow {case.argv[0]}: "), lines[0]


# --------------------------------------------------------------------------- in process
def test_get_settings_raises_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERFLOW_PARTITIONS", "0")
    monkeypatch.setenv("TIERFLOW_REPLAY_DUTY", "2")
    get_settings.cache_clear()
    try:
        with pytest.raises(ConfigError) as e:
            get_settings()
    finally:
        get_settings.cache_clear()
    assert str(e.value).splitlines() == ["TIERFLOW_PARTITIONS='0': expected an integer >= 1",
                                         "TIERFLOW_REPLAY_DUTY='2': expected a number > 0.0 and <= 1.0"]


@pytest.mark.parametrize("bootstrap", ["k1:9093,k2:9093", "[::1]:9092", " h:1 , h:65535", "SSL://h:9093"])
def test_valid_bootstraps_pass(bootstrap: str) -> None:
    assert Settings(kafka_bootstrap=bootstrap).kafka.bootstrap == bootstrap


@pytest.mark.parametrize("bootstrap", ["localhost", "h:0", "h:65536", "h:x", ":9092", ","])
def test_invalid_bootstraps_fail(bootstrap: str) -> None:
    with pytest.raises(ValidationError) as e:
        Settings(kafka_bootstrap=bootstrap)
    line = str(settings_error(e.value, environ={}))
    assert line == f"TIERFLOW_KAFKA_BOOTSTRAP={bootstrap!r}: expected host:port with a port 1-65535, " \
                   "comma-separated for several brokers"


def test_log_level_any_case() -> None:
    assert Settings(log_level="debug").log_level == "DEBUG"


def test_secrets_are_not_echoed() -> None:
    with pytest.raises(ValidationError) as e:
        Settings(kafka_sasl_password=["not", "a", "string"])
    assert str(settings_error(e.value, environ={})) == "TIERFLOW_KAFKA_SASL_PASSWORD='***': expected a string, or unset"


def test_unknown_variables_get_a_suggestion() -> None:
    env = {"TIERFLOW_PARTITION": "8", "TIERFLOW_FOO": "1", "TIERFLOW_PARTITIONS": "8", "tierflow_log_level": "info",
           "TIERFLOW_TEST_BOOTSTRAP": "k:9092", "TIERFLOW_RELIABILITY_JSON": "r.json", "HOME": "/"}
    assert unknown_env(env) == ["TIERFLOW_FOO is not a tierflow setting, ignored",
                                "TIERFLOW_PARTITION is not a tierflow setting, ignored; did you mean "
                                "TIERFLOW_PARTITIONS?"]

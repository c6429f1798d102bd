"""A real Prometheus scrapes `tierflow up --metrics-port BASE`: one /metrics port per agent, every target up, and
evaluates tierflow's alert rules against it.

`tierflow up --metrics-port BASE` gives ingest BASE, worker-light BASE+1, worker-heavy BASE+2, worker-multimodal
BASE+3 and feedback BASE+4, and says so in its banner. This test runs `tierflow up` (echo models, against the
session's broker and Redis) as an operator would, points a Prometheus server (Debian's `prometheus` package:
`make tools` installs it where it can) at the five ports with deploy/prometheus/alerts.yml loaded, sends a few
requests and asks Prometheus, through its HTTP API, whether every target is up, whether ingest's request
counter arrived and whether any alert is pending on the healthy stack (none may be). Then it stops the heavy
worker (SIGSTOP: `up` would restart one that exited) and waits for TierflowHeavyDegraded to fire within its
`for:` (shortened to 10 s in the rules it loads: promtool checks the deployed 2 minutes). It reads metrics, not
the broker: it runs on the default broker's pass only (on tansu's it would add its time again to the suite's for
no new coverage).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from pipeline.adapters.heartbeats import read_heartbeats
from pipeline.adapters.kafka import topics_of
from pipeline.adapters.tails import AnswerReader
from pipeline.ops.devstack import AGENTS, Proc, Stack, free_port, port_open
from pipeline.settings import Settings
from tests.faults.harness import ECHO, request
from tests.integration.helpers import produce_all

pytestmark = pytest.mark.integration

JOBS = [name for name, _ in AGENTS]  # ingest, worker-light, worker-heavy, worker-multimodal, feedback
ALERT_RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
# The degraded alert's `for:` in the rules this test loads: deploy's 2 minutes would be 2 minutes of waiting, and
# promtool already checks the deployed `for:` (tests/prometheus/alerts_test.yml, test_alert_rules.py). The rule's
# expression, the metrics it reads and Prometheus' pending-then-firing are what this test adds, on a shorter `for:`.
DEGRADED_FOR = "10s"
DETECT_S = 20.0  # heavy stopped -> alert pending: heartbeat TTL 5 s, ingest's check, a 1 s scrape, a 1 s evaluation
UP_READY_TIMEOUT_S = 180.0
SCRAPE_TIMEOUT_S = 60.0
N_REQUESTS = 8


def prometheus_binary() -> str | None:
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


def free_port_run(n: int, tries: int = 50) -> int:
    """A port BASE with BASE .. BASE+n-1 all free on 127.0.0.1 right now."""
    for _ in range(tries):
        base = free_port()
        if base + n > 65535:
            continue
        ok = True
        for port in range(base, base + n):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no run of {n} free ports found in {tries} tries")


def api(port: int, path: str, **params: str) -> dict[str, Any]:
    """GET Prometheus' HTTP API; its JSON answer (status "success" checked by the caller)."""
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def wait_for_line(proc: Proc, needle: str, timeout_s: float) -> str:
    """Until `needle` is in the process' output (its log file); that output. Fails if it exits first."""
    assert proc.log_path is not None
    deadline = time.monotonic() + timeout_s
    while True:
        text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
        if needle in text:
            return text
        if proc.popen.poll() is not None:
            pytest.fail(f"{proc.name} exited ({proc.popen.returncode}) before printing {needle!r}:\n{text[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.name} did not print {needle!r} within {timeout_s:.0f} s:\n{text[-4000:]}")
        time.sleep(0.2)


def shortened_rules(path: Path, alert: str, for_: str) -> Path:
    """deploy/prometheus/alerts.yml with `alert`'s `for:` set to `for_`, written to `path`; every other rule as is."""
    rules = yaml.safe_load(ALERT_RULES.read_text())
    found = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert len(found) == 1, f"{alert} not in {ALERT_RULES}"
    found[0]["for"] = for_
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def prometheus_config(path: Path, ports: dict[str, int], rules: Path) -> Path:
    jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
                   for job, port in ports.items())
    path.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    f"rule_files:\n  - {rules}\nscrape_configs:\n{jobs}")
    return path


def rule_for_s(rules: Path, alert: str) -> float:
    """An alert's `for:` in seconds, from the rules file Prometheus loaded."""
    units = {"s": 1, "m": 60, "h": 3600}
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                text = str(rule.get("for", "0s"))
                return float(text[:-1]) * units[text[-1]]
    raise KeyError(alert)


def alerts(prom_port: int) -> dict[str, str]:
    """alertname -> state ("pending" or "firing") of every active alert."""
    return {a["labels"]["alertname"]: a["state"] for a in api(prom_port, "/api/v1/alerts")["data"]["alerts"]}


def rule_evaluations(prom_port: int) -> list[str]:
    return [g.get("lastEvaluation", "") for g in api(prom_port, "/api/v1/rules")["data"]["groups"]]


def heavy_pids(s: Settings) -> list[int]:
    """The heavy workers' pids, from their heartbeats (worker ids end in the pid)."""
    r = redis.Redis.from_url(s.redis.address)
    return [int(b["worker"].rsplit("-", 1)[1]) for b in read_heartbeats(r, s.redis.prefix, "heavy")]


def test_prometheus_scrapes_every_agent_of_tierflow_up(settings_factory: Callable[..., Settings],
                                                       tmp_path: Path) -> None:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip("Prometheus not installed (apt-get install prometheus)")
    if Settings().kafka.embedded and Settings().embedded.broker == "tansu":
        pytest.skip("Prometheus reads the agents' /metrics and alert rules, not the broker: run on the default "
                    "broker's pass (on tansu's it would add its 2-minute alert wait again to the suite)")
    s = settings_factory(data_dir=tmp_path / "up")
    base = free_port_run(len(JOBS))
    ports = {job: base + i for i, job in enumerate(JOBS)}
    stack = Stack(s)
    try:
        t0 = time.monotonic()
        # The heavy worker on CPU without asking torch for a GPU: importing torch costs it 10-25 s of start here.
        up = stack.start_agent("up", "up", "--metrics-port", str(base),
                               env={**ECHO, "TIERFLOW_HEAVY_DEVICE": "cpu", "TIERFLOW_DATA_DIR": str(s.data_dir),
                                    "TIERFLOW_METRICS_PORT": None})
        banner = wait_for_line(up, "tierflow is up", UP_READY_TIMEOUT_S)
        up_s = time.monotonic() - t0
        metrics_line = next((ln for ln in banner.splitlines() if ln.strip().startswith("metrics ")), "")
        assert dict(re.findall(r"([\w-]+) :(\d+)", metrics_line)) == {j: str(p) for j, p in ports.items()}, banner
        for job, port in ports.items():
            assert port_open("127.0.0.1", port), f"{job}: nothing listens on :{port} after the banner\n{banner}"

        prom_port = free_port()
        rules = shortened_rules(tmp_path / "alerts.yml", "TierflowHeavyDegraded", DEGRADED_FOR)
        config = prometheus_config(tmp_path / "prometheus.yml", ports, rules)
        prom = stack.spawn("prometheus", [binary, f"--config.file={config}",
                                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if prom.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus not ready (exit {prom.popen.poll()}):\n{stack.tail('prometheus', 30)}")
            time.sleep(0.2)

        reader = AnswerReader(s, from_beginning=True)
        ids = [f"prom-{i}" for i in range(N_REQUESTS)]
        produce_all(s, topics_of(s).requests, [request(rid, "heavy" if i == 0 else "light")
                                               for i, rid in enumerate(ids)], keys=ids)
        answered: set[str] = set()
        try:
            deadline = time.monotonic() + 60
            while answered < set(ids) and time.monotonic() < deadline:
                answered |= {str(a["request_id"]) for a in reader.poll(0.5)}
        finally:
            reader.close()
        assert answered == set(ids), f"{len(answered)} of {N_REQUESTS} answered:\n{stack.tail('up', 30)}"

        # Prometheus' own view, until every target is up and ingest's counter has every request (1 s scrapes).
        t_scrape = time.monotonic()
        targets: list[dict[str, Any]] = []
        up_values: dict[str, str] = {}
        requests_by_job: dict[str, float] = {}
        answers_by_job: dict[str, float] = {}
        while time.monotonic() - t_scrape < SCRAPE_TIMEOUT_S:
            try:
                targets = api(prom_port, "/api/v1/targets")["data"]["activeTargets"]
                up_values = {r["metric"]["job"]: r["value"][1]
                             for r in api(prom_port, "/api/v1/query", query="up")["data"]["result"]}
                requests_by_job = {r["metric"].get("job", "?"): float(r["value"][1]) for r in
                                   api(prom_port, "/api/v1/query",
                                       query="sum by (job) (tierflow_requests_total)")["data"]["result"]}
                answers_by_job = {r["metric"].get("job", "?"): float(r["value"][1]) for r in
                                  api(prom_port, "/api/v1/query",
                                      query="sum by (job) (tierflow_answers_total)")["data"]["result"]}
            except (urllib.error.URLError, OSError, KeyError, ValueError):
                pass
            healthy = {t["labels"]["job"] for t in targets if t["health"] == "up"}
            if healthy == set(JOBS) and all(up_values.get(j) == "1" for j in JOBS) \
                    and requests_by_job.get("ingest", 0) >= N_REQUESTS \
                    and sum(answers_by_job.values()) >= N_REQUESTS:
                break
            time.sleep(0.5)
        scrape_s = time.monotonic() - t_scrape

        why = "\n".join(f"{t['labels']['job']} {t['scrapeUrl']}: {t['health']} {t['lastError']}" for t in targets)
        assert sorted(t["labels"]["job"] for t in targets) == sorted(JOBS), why
        for t in targets:
            assert t["health"] == "up", why
            assert t["scrapeUrl"] == f"http://127.0.0.1:{ports[t['labels']['job']]}/metrics", why
        assert up_values == {j: "1" for j in JOBS}, up_values
        # Ingest counted every request, and only ingest's port serves that counter: the ports are not crossed.
        assert requests_by_job.get("ingest", 0) >= N_REQUESTS, requests_by_job
        assert set(requests_by_job) == {"ingest"}, requests_by_job
        assert set(answers_by_job) <= {"worker-light", "worker-heavy", "worker-multimodal"}, answers_by_job
        assert answers_by_job.get("worker-light", 0) >= N_REQUESTS - 1, answers_by_job
        print(f"tierflow up ready in {up_s:.1f} s; Prometheus saw all {len(JOBS)} targets up and "
              f"tierflow_requests_total={requests_by_job['ingest']:.0f} in {scrape_s:.1f} s")

        # A healthy stack fires nothing, and holds nothing pending: let every rule group evaluate a few times.
        seen = rule_evaluations(prom_port)
        deadline = time.monotonic() + 30
        changes = 0
        while changes < 3 and time.monotonic() < deadline:
            time.sleep(1.0)
            now = rule_evaluations(prom_port)
            if all(a != b for a, b in zip(now, seen, strict=True)):
                changes, seen = changes + 1, now
        assert changes >= 3, f"Prometheus did not evaluate the rules: {api(prom_port, '/api/v1/rules')}"
        assert alerts(prom_port) == {}, f"alerts on a healthy stack: {api(prom_port, '/api/v1/alerts')}"
        healthy_now = api(prom_port, "/api/v1/query", query="min(tierflow_heavy_healthy)")["data"]["result"]
        assert [r["value"][1] for r in healthy_now] == ["1"], healthy_now

        pids = heavy_pids(s)
        assert pids, "no heavy worker heartbeat"
        for_s = rule_for_s(rules, "TierflowHeavyDegraded")
        t_stop = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            pending_s = firing_s = None
            state: dict[str, str] = {}
            while firing_s is None and time.monotonic() - t_stop < for_s + 2 * DETECT_S:
                state = alerts(prom_port)
                if pending_s is None and "TierflowHeavyDegraded" in state:
                    pending_s = time.monotonic() - t_stop
                if state.get("TierflowHeavyDegraded") == "firing":
                    firing_s = time.monotonic() - t_stop
                time.sleep(1.0)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert pending_s is not None and pending_s <= DETECT_S, (pending_s, state)
        assert firing_s is not None and firing_s <= for_s + DETECT_S, (firing_s, for_s, state)
        print(f"heavy stopped: TierflowHeavyDegraded pending after {pending_s:.1f} s, firing after {firing_s:.1f} s "
              f"(for: {for_s:.0f} s); also active: {sorted(set(state) - {'TierflowHeavyDegraded'})}")
    finally:
        stack.stop(timeout=20)


def test_up_exits_non_zero_naming_an_agent_that_cannot_take_its_metrics_port(
        settings_factory: Callable[..., Settings], tmp_path: Path) -> None:
    """Another program holds worker-heavy's port: `up` stops, exits 1 and names the agent and its error (it used
    to crash-loop every agent but ingest and exit 0)."""
    s = settings_factory(data_dir=tmp_path / "up")
    base = free_port_run(len(JOBS))
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", base + JOBS.index("worker-heavy")))
    taken.listen()
    stack = Stack(s)
    try:
        up = stack.start_agent("up", "up", "--metrics-port", str(base),
                               env={**ECHO, "TIERFLOW_HEAVY_DEVICE": "cpu", "TIERFLOW_DATA_DIR": str(s.data_dir),
                                    "TIERFLOW_METRICS_PORT": None})
        code = up.popen.wait(timeout=UP_READY_TIMEOUT_S)
        out = stack.tail("up", 40)
        assert code == 1, out
        last = [ln for ln in out.splitlines() if ln.startswith("tierflow up: ")][-1]
        assert "worker-heavy" in last and "in use" in last, out
    finally:
        taken.close()
        stack.stop()

"""Deployment files agree with the code: compose, k8s, Prometheus, Grafana, Dockerfile (no Docker, no network).

What a broken file would cost a user: a stack that does not start, a KEDA trigger watching the wrong
group, topics with other partitions than the workers expect, a dashboard or an alert that stays empty.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Collection, Iterator
from contextlib import redirect_stderr, redirect_stdout
from functools import cache
from io import StringIO
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prometheus_client.metrics import MetricWrapperBase

from pipeline import metrics
from pipeline.contracts.topics import Tier, Topics, topic_specs
from pipeline.settings import NOT_SETTINGS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
K8S = ROOT / "deploy" / "k8s"
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
COMPOSE_SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"  # compose-spec/compose-spec, Apache-2.0
K8S_VERSION = "1.30"  # the oldest Kubernetes the manifests must load on
METRICS_PORT = 9100
K8S_COMPONENTS = ("ingest", "light", "heavy", "multimodal", "feedback", "trainer")
# Agents that must run as exactly one process: two threshold controllers or two trainers would both decide.
SINGLETONS = {"feedback": ["tierflow", "feedback"], "trainer": ["tierflow", "learn"]}
# Kinds without a schema in kubernetes-validate: checked structurally below.
CUSTOM_KINDS = {"ScaledObject", "Kafka", "KafkaNodePool", "KafkaTopic", "ServiceMonitor", "PrometheusRule"}
PROMQL_BUILTINS = {"up"}  # series Prometheus makes itself
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def consumer_groups(s: Settings) -> dict[str, str]:
    """The Kafka consumer group of each scaled component, as the code names them: what KEDA must watch."""
    return {"ingest": s.group("ingest")} | {t.value: s.group(f"workers-{t.value}") for t in Tier}


# --- loading -------------------------------------------------------------------------------------------


def env_example() -> dict[str, str]:
    """`.env.example` as NAME -> value, for the lines that are set (not commented out)."""
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if re.match(r"^[A-Z_]+=", line))
    return {k: v for k, v in pairs}


def documented_env_names() -> set[str]:
    """Every variable `.env.example` mentions, set or commented out."""
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.MULTILINE))


_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}` / `${VAR:-default}` substitution, applied through a loaded document."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: env.get(m["name"]) or m["default"] or "", value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


@cache
def compose() -> dict[str, Any]:
    """docker-compose.yml as compose sees it with `.env.example` copied to `.env`."""
    doc: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE.read_text()), env_example())
    return doc


def services() -> dict[str, dict[str, Any]]:
    svcs: dict[str, dict[str, Any]] = compose()["services"]
    return svcs


def tierflow_services() -> dict[str, dict[str, Any]]:
    """Services whose command is a `tierflow ...` command."""
    return {n: s for n, s in services().items() if s.get("command", [None])[0] == "tierflow"}


def long_running_services() -> dict[str, dict[str, Any]]:
    """tierflow services that stay up and serve /metrics (all but the one-shot `topics create`)."""
    return {n: s for n, s in tierflow_services().items() if s["command"][1:3] != ["topics", "create"]}


def k8s_docs(directory: Path = K8S) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every resource in the YAML files under `directory` (recursively), kustomizations excluded."""
    for path in sorted(directory.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def k8s_by_kind(kind: str, directory: Path = K8S) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_docs(directory) if d["kind"] == kind}


def configmap() -> dict[str, str]:
    data: dict[str, str] = k8s_by_kind("ConfigMap")["tierflow-settings"]["data"]
    return data


def k8s_settings() -> Settings:
    """The Settings every k8s pod gets from the ConfigMap (placeholders for the Secret)."""
    return settings_from(configmap())


def settings_from(env: dict[str, str]) -> Settings:
    """Settings as a process with exactly `env` (TIERFLOW_* only) would read them."""
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("TIERFLOW_")]:
            mp.delenv(k)
        for k, v in env.items():
            if k.startswith("TIERFLOW_"):
                mp.setenv(k, str(v))
        return Settings()


@cache
def exported_series() -> frozenset[str]:
    """Every series name pipeline/metrics.py can expose (counters as _total, histograms as their parts)."""
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"], "info": ["_info"]}
    names = set()
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase | metrics.OwnedGauge):
            for family in obj.describe():
                names |= {family.name + s for s in suffixes[family.type]}
    return frozenset(names)


def promql_metrics(expr: str) -> set[str]:
    """Metric names an expression selects; a syntax error fails the test (promql-parser is Prometheus's grammar)."""
    promql_parser = pytest.importorskip("promql_parser", reason="dev dependency promql-parser is not installed")
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    try:
        ast = promql_parser.parse(expr)
    except ValueError as e:
        pytest.fail(f"PromQL does not parse: {e}\n{expr}")
    names: set[str] = set()
    promql_parser.walk(ast, lambda n: names.add(n.name) if isinstance(n, promql_parser.VectorSelector) else None)
    return names


def assert_known_metrics(exprs: dict[str, str], extra: Collection[str] = ()) -> None:
    known = exported_series() | PROMQL_BUILTINS | set(extra)
    unknown = {where: sorted(promql_metrics(e) - known) for where, e in exprs.items()}
    assert not {k: v for k, v in unknown.items() if v}, f"metrics not in pipeline/metrics.py: {unknown}"


# --- compose -------------------------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_spec_schema() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, "\n".join(errors)


def _compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or Debian's `docker-compose`; None when neither is installed."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def test_compose_config_accepts_the_file() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` / `docker-compose` binary (apt-get install docker-compose); "
                    "the compose-spec schema test still checks the file")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERFLOW_", "COMPOSE_"))}
    for profiles in ([], ["--profile", "cpu", "--profile", "gpu"]):
        cmd = [*cli, "--project-directory", str(ROOT), "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE),
               *profiles, "config", "-q"]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, f"{shlex.join(cmd)}:\n{out.stderr}"


def test_pipeline_starts_in_order_and_restarts() -> None:
    svcs = services()
    assert svcs["kafka"]["image"].startswith("apache/kafka:")
    kafka_env = svcs["kafka"]["environment"]
    assert {"broker", "controller"} == set(kafka_env["KAFKA_PROCESS_ROLES"].split(","))  # KRaft, no ZooKeeper
    assert svcs["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name, svc in long_running_services().items():
        assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully", name
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy", name
        # healthy means ready (model loaded, partitions assigned), not merely answering /metrics
        assert f"127.0.0.1:{METRICS_PORT}/ready" in " ".join(svc["healthcheck"]["test"]), name
    for name, svc in svcs.items():
        assert svc.get("restart"), f"{name} has no restart policy"
        if name != "topics":
            assert "healthcheck" in svc, f"{name} has no health check"


def test_every_tier_has_workers_and_light_scales() -> None:
    workers = {n: s["command"] for n, s in long_running_services().items() if s["command"][1] == "worker"}
    tiers = {cmd[cmd.index("--tier") + 1] for cmd in workers.values()}
    assert tiers == {t.value for t in Tier}
    light = services()["light"]
    assert "container_name" not in light and "ports" not in light, "`--scale light=N` needs no fixed name/port"


def test_heavy_runs_on_a_gpu_with_a_cpu_fallback_profile() -> None:
    heavy = {n: s for n, s in long_running_services().items() if s["command"][1:4] == ["worker", "--tier", "heavy"]}
    gpu = [s for s in heavy.values() if s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")]
    assert len(gpu) == 1
    (device,) = gpu[0]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "--device" in gpu[0]["command"] and gpu[0]["command"][gpu[0]["command"].index("--device") + 1] == "cuda"
    cpu = [s for s in heavy.values() if s is not gpu[0]]
    assert len(cpu) == 1 and cpu[0]["command"][cpu[0]["command"].index("--device") + 1] == "cpu"
    assert set(gpu[0]["profiles"]) != set(cpu[0]["profiles"])
    assert env_example()["COMPOSE_PROFILES"] in {*gpu[0]["profiles"], *cpu[0]["profiles"]}


def test_compose_topics_match_topic_specs() -> None:
    topics_svc = services()["topics"]
    assert topics_svc["command"] == ["tierflow", "topics", "create"]
    s = settings_from(topics_svc["environment"])
    specs = topic_specs(Topics(s.topic.prefix), s.partitions, s.replication_factor, s.max_message_bytes)
    assert s.replication_factor == 1, "compose runs one broker"
    # Every process sees the topics the init service made: same prefix, partitions and record size.
    for name, svc in long_running_services().items():
        other = settings_from(svc["environment"])
        assert topic_specs(Topics(other.topic.prefix), other.partitions, other.replication_factor,
                           other.max_message_bytes) == specs, name
        assert (other.kafka.bootstrap, other.redis.url) == (s.kafka.bootstrap, s.redis.url), name
    assert {Topics(s.topic.prefix).tier(t) for t in Tier} <= {spec.name for spec in specs}
    kafka_env = services()["kafka"]["environment"]
    assert kafka_env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", "topics must come from `topics create` only"
    assert int(kafka_env["KAFKA_MESSAGE_MAX_BYTES"]) >= s.max_message_bytes
    assert s.kafka.bootstrap == "kafka:9092" and "INTERNAL://kafka:9092" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]


# --- settings / .env.example ---------------------------------------------------------------------------


def _tierflow_names_used() -> dict[str, set[str]]:
    """TIERFLOW_* names each deployment file sets or reads."""
    raw = COMPOSE.read_text()
    in_compose = set(re.findall(r"\b(TIERFLOW_[A-Z0-9_]+)\b", raw))
    secret = k8s_by_kind("Secret")["tierflow-secrets"]["stringData"]
    dockerfile = set(re.findall(r"\b(TIERFLOW_[A-Z0-9_]+)=", (ROOT / "Dockerfile").read_text()))
    return {
        ".env.example": {n for n in documented_env_names() if n.startswith("TIERFLOW_")},
        "docker-compose.yml": in_compose,
        "k8s ConfigMap/Secret": set(configmap()) | set(secret),
        "Dockerfile": dockerfile,
    }


def test_every_tierflow_variable_is_a_setting() -> None:
    fields = {f"TIERFLOW_{f.upper()}" for f in Settings.flat_fields()} | NOT_SETTINGS
    typos = {where: sorted(names - fields) for where, names in _tierflow_names_used().items()}
    assert not {k: v for k, v in typos.items() if v}, f"not Settings fields (silently ignored): {typos}"


def test_env_example_documents_every_setting_with_valid_values() -> None:
    fields = {f"TIERFLOW_{f.upper()}" for f in Settings.flat_fields()}
    assert not fields - documented_env_names(), "add these settings to .env.example"
    settings_from(env_example())  # every value set there parses
    defaults = {m["name"]: m["default"] for m in _INTERPOLATION.finditer(COMPOSE.read_text()) if m["default"]}
    example = env_example()
    assert {n: d for n, d in defaults.items() if example.get(n) != d} == {}, "compose defaults != .env.example"
    assert {m["name"] for m in _INTERPOLATION.finditer(COMPOSE.read_text())} <= set(example)


# --- CLI commands --------------------------------------------------------------------------------------


def _commands() -> dict[str, list[str]]:
    """Every `tierflow ...` command line in compose and k8s, by where it is."""
    found = {f"compose:{n}": [str(a) for a in s["command"]] for n, s in tierflow_services().items()}
    for path, doc in k8s_docs():
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                found[f"{path.name}:{c['name']}"] = [str(a) for a in c.get("command", []) + c.get("args", [])]
    return found


def test_every_deployed_command_exists_in_the_cli() -> None:
    commands = _commands()
    assert all(argv[0] == "tierflow" for argv in commands.values()), commands
    if not (ROOT / "pipeline" / "cli.py").exists():
        pytest.skip("pipeline/cli.py is not written yet")
    from pipeline.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for where, argv in commands.items():
        assert argv[1] in subcommands, f"{where}: `tierflow {argv[1]}` is not a subcommand"
        err = StringIO()
        try:
            with redirect_stderr(err), redirect_stdout(StringIO()):
                parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{shlex.join(argv)}` is rejected by the CLI: {err.getvalue()}")


# --- Kubernetes ----------------------------------------------------------------------------------------


def test_kustomizations_list_every_manifest() -> None:
    for kustomization in K8S.rglob("kustomization.yaml"):
        listed = yaml.safe_load(kustomization.read_text())["resources"]
        present = sorted(p.name for p in kustomization.parent.glob("*.yaml") if p.name != "kustomization.yaml")
        assert sorted(listed) == present, kustomization


def test_core_k8s_manifests_validate_against_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="dev dependency kubernetes-validate is not installed")
    checked = 0
    for path, doc in k8s_docs():
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: "
                        f"{'.'.join(map(str, e.path))}: {e.message}")
        checked += 1
    assert checked >= 3 * len(K8S_COMPONENTS)  # Deployment + Service + PDB each


def test_custom_resources_have_the_fields_their_operators_require() -> None:
    for path, doc in k8s_docs():
        if doc["kind"] not in CUSTOM_KINDS:
            continue
        where = f"{path.name} {doc['kind']}"
        assert set(doc) >= {"apiVersion", "kind", "metadata", "spec"}, where
        assert doc["metadata"].get("name") and doc["metadata"].get("namespace"), where
        group = doc["apiVersion"].split("/")[0]
        expected = {"ScaledObject": "keda.sh", "ServiceMonitor": "monitoring.coreos.com",
                    "PrometheusRule": "monitoring.coreos.com"}.get(doc["kind"], "kafka.strimzi.io")
        assert group == expected, where


def test_every_component_runs_with_settings_metrics_and_a_disruption_budget() -> None:
    assert k8s_settings().metrics_port == METRICS_PORT
    deployments, services_ = k8s_by_kind("Deployment"), k8s_by_kind("Service")
    pdbs = k8s_by_kind("PodDisruptionBudget")
    for component in K8S_COMPONENTS:
        name = f"tierflow-{component}"
        dep = deployments[name]
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        refs = {next(iter(r.values()))["name"] for r in container["envFrom"]}
        assert refs == {"tierflow-settings", "tierflow-secrets"}, name
        assert {"name": "metrics", "containerPort": METRICS_PORT} in container["ports"], name
        assert container["livenessProbe"]["httpGet"]["port"] == "metrics", name
        # alive = /metrics answers; started and ready = /ready answers 200 (pipeline/adapters/probes.py)
        probes = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        assert probes == {"startupProbe": "/ready", "readinessProbe": "/ready", "livenessProbe": "/metrics"}, name
        assert services_[name]["spec"]["selector"].items() <= pod_labels.items(), name
        assert pdbs[name]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), name
        gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
        spec = dep["spec"]["template"]["spec"]
        if component == "heavy":
            assert gpus == 1, "one heavy worker per GPU"
            assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"]) and spec["nodeSelector"]
            assert container["command"][container["command"].index("--device") + 1] == "cuda"
        else:
            assert gpus is None and "tolerations" not in spec, f"{name} must not hold a GPU"


def test_every_pod_runs_hardened_with_a_writable_tmp_only() -> None:
    """Non-root, no privilege escalation, no capabilities, a read-only root: /tmp (an emptyDir) is the one place a
    process writes (the image points its caches there; the trainer's retraining files go there)."""
    for name, dep in k8s_by_kind("Deployment").items():
        spec = dep["spec"]["template"]["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] and pod["seccompProfile"]["type"] == "RuntimeDefault", name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], name
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], name
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]], f"{name}: no writable /tmp"


def test_singleton_agents_run_exactly_once() -> None:
    """The feedback agent and the trainer decide for the whole pipeline (thresholds; the live light model): one
    replica, and Recreate, so an old and a new pod never overlap during a rollout; no autoscaler; compose runs one
    service each, with one replica."""
    deployments = k8s_by_kind("Deployment")
    scaled = {so["spec"]["scaleTargetRef"]["name"] for so in k8s_by_kind("ScaledObject").values()}
    for component, argv in SINGLETONS.items():
        name = f"tierflow-{component}"
        dep = deployments[name]
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}, name
        assert name not in scaled, name
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert container["command"] == argv, name
        in_compose = {n: s for n, s in long_running_services().items() if s["command"] == argv}
        assert list(in_compose) == [component], f"compose must run `{shlex.join(argv)}` as one service"
        assert in_compose[component].get("deploy", {}).get("replicas", 1) == 1, component


def test_keda_scales_each_tier_on_its_consumer_groups_lag() -> None:
    s = k8s_settings()
    groups = consumer_groups(s)
    assert groups["ingest"] == "tierflow-ingest" and groups["light"] == "tierflow-workers-light"
    topics = Topics(s.topic.prefix)
    expected_topic = {"ingest": topics.requests} | {t.value: topics.tier(t) for t in Tier}
    scaled = k8s_by_kind("ScaledObject")
    assert {so["spec"]["scaleTargetRef"]["name"] for so in scaled.values()} == {
        f"tierflow-{c}" for c in groups}
    deployments = k8s_by_kind("Deployment")
    for so in scaled.values():
        target = so["spec"]["scaleTargetRef"]["name"]
        component = target.removeprefix("tierflow-")
        assert "replicas" not in deployments[target]["spec"], f"{target}: KEDA owns replicas"
        (trigger,) = so["spec"]["triggers"]
        meta = trigger["metadata"]
        assert trigger["type"] == "kafka"
        assert all(isinstance(v, str) for v in meta.values()), f"{target}: KEDA metadata values are strings"
        # The address in one place: KEDA resolves it from the target container's env (its ConfigMap)
        assert "bootstrapServers" not in meta and meta["bootstrapServersFromEnv"] == "TIERFLOW_KAFKA_BOOTSTRAP", target
        (container,) = deployments[target]["spec"]["template"]["spec"]["containers"]
        assert {"configMapRef": {"name": "tierflow-settings"}} in container["envFrom"], target
        assert configmap()["TIERFLOW_KAFKA_BOOTSTRAP"] == s.kafka.bootstrap
        assert meta["consumerGroup"] == groups[component], target
        assert meta["topic"] == expected_topic[component], target
        # Scaling to zero would hide the tier from ingest's heartbeat-based health; more consumers than
        # partitions sit idle.
        assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"] <= s.partitions, target


def test_strimzi_cluster_has_three_brokers_behind_the_configured_bootstrap() -> None:
    kafka_dir = K8S / "kafka"
    (kafka,) = k8s_by_kind("Kafka", kafka_dir).values()
    name, ns = kafka["metadata"]["name"], kafka["metadata"]["namespace"]
    pools = [p for p in k8s_by_kind("KafkaNodePool", kafka_dir).values()
             if p["metadata"]["labels"]["strimzi.io/cluster"] == name]
    assert sum(p["spec"]["replicas"] for p in pools if "broker" in p["spec"]["roles"]) == 3
    # Strimzi 1.0 runs KRaft with node pools only: the v1beta2-era opt-in annotations would be dead text.
    assert not set(kafka["metadata"].get("annotations", {})) & {"strimzi.io/node-pools", "strimzi.io/kraft"}
    assert kafka["spec"]["kafka"]["config"]["min.insync.replicas"] == 2
    plain = next(li for li in kafka["spec"]["kafka"]["listeners"] if not li["tls"])
    assert k8s_settings().kafka.bootstrap == f"{name}-kafka-bootstrap.{ns}.svc:{plain['port']}"
    assert kafka["spec"]["kafka"]["config"]["message.max.bytes"] >= k8s_settings().max_message_bytes


def test_strimzi_topics_match_topic_specs() -> None:
    s = k8s_settings()
    assert s.replication_factor == 3
    specs = topic_specs(Topics(s.topic.prefix), s.partitions, 3, s.max_message_bytes)
    cluster = next(iter(k8s_by_kind("Kafka", K8S / "kafka")))
    declared = {}
    for doc in k8s_by_kind("KafkaTopic", K8S / "kafka").values():
        assert doc["metadata"]["labels"]["strimzi.io/cluster"] == cluster
        assert doc["spec"]["replicas"] == 3
        declared[doc["spec"]["topicName"]] = (doc["spec"]["partitions"],
                                              {k: str(v) for k, v in doc["spec"]["config"].items()})
    assert declared == {spec.name: (spec.partitions, spec.config) for spec in specs}
    assert all(cfg["min.insync.replicas"] == "2" for _, cfg in declared.values())


# --- Prometheus ----------------------------------------------------------------------------------------


def test_prometheus_scrapes_every_long_running_service() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert {"global", "scrape_configs", "rule_files"} <= set(config)
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS / rule_file).is_file(), rule_file
    jobs = [j["job_name"] for j in config["scrape_configs"]]
    assert len(jobs) == len(set(jobs)), "duplicate job_name"
    scraped: set[str] = set()
    for job in config["scrape_configs"]:
        assert job.keys() & {"static_configs", "dns_sd_configs"}, job["job_name"]
        for sd in job.get("dns_sd_configs", []):
            assert sd["port"] == METRICS_PORT and sd["type"] == "A", job["job_name"]
            scraped |= set(sd["names"])
    assert scraped == set(long_running_services())
    for name, svc in long_running_services().items():
        assert settings_from(svc["environment"]).metrics_port == METRICS_PORT, name
    prom = services()["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prom["volumes"] if v.startswith("./"))
    assert f"--config.file={mounts['./deploy/prometheus']}/prometheus.yml" in prom["command"]


def test_alert_rules_are_well_formed_and_use_existing_metrics() -> None:
    rules_doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    exprs, recorded, alerts = {}, set(), {}
    for group in rules_doc["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert ("alert" in rule) != ("record" in rule), rule
            if "record" in rule:
                recorded.add(rule["record"])
                exprs[rule["record"]] = rule["expr"]
                continue
            alerts[rule["alert"]] = rule
            exprs[rule["alert"]] = rule["expr"]
            assert re.fullmatch(r"\d+[smhd]", rule.get("for", "0s")), rule["alert"]
            assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
    assert len(alerts) == len(exprs) - len(recorded), "duplicate alert names"
    assert_known_metrics(exprs, recorded)
    used = {name: promql_metrics(e) for name, e in exprs.items()}
    for must in ("tierflow_end_to_end_seconds_bucket", "tierflow_consumer_lag", "tierflow_dlq_total",
                 "tierflow_worker_heartbeat_timestamp_seconds"):
        assert any(must in names for names in used.values()), f"no alert on {must}"
    assert any("absent(" in e and "tierflow_worker_heartbeat" in e for e in exprs.values())


def test_k8s_prometheus_rule_is_the_alerts_file() -> None:
    rule = k8s_by_kind("PrometheusRule")["tierflow"]
    assert rule["spec"] == yaml.safe_load((PROMETHEUS / "alerts.yml").read_text()), (
        "deploy/k8s/monitoring/prometheusrule.yaml is stale: rebuild it as docs/deploy.md says")


# --- Grafana -------------------------------------------------------------------------------------------


def test_grafana_provisioning_points_at_the_dashboards_and_datasource() -> None:
    (ds,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090" and ds["uid"]
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/tierflow.yml").read_text())["providers"]
    mounts = dict(v.split(":")[:2] for v in services()["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


def _dashboards() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted((GRAFANA / "dashboards").glob("*.json")):
        yield path, json.loads(path.read_text())


def test_grafana_dashboard_structure() -> None:
    (ds,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())["datasources"]
    for path, dash in _dashboards():
        assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36, path.name
        assert dash["uid"] and dash["title"] and dash["panels"], path.name
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        cells: dict[tuple[int, int], str] = {}
        for panel in dash["panels"]:
            g = panel["gridPos"]
            assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), panel["title"]
            assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, panel["title"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                    cells[(x, y)] = panel["title"]
            if panel["type"] == "row":
                continue
            # the datasource variable: the provisioned default here, whatever Prometheus an importer picks there
            assert panel["datasource"] == DATASOURCE, panel["title"]
            assert panel["targets"], panel["title"]
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert len(ref_ids) == len(set(ref_ids)), panel["title"]
            for target in panel["targets"]:
                assert target["expr"] and target["datasource"] == DATASOURCE, panel["title"]
                for name in promql_metrics(target["expr"]) - PROMQL_BUILTINS:  # every query follows the filters
                    assert f'{name}{{' in target["expr"] and 'job=~"$job"' in target["expr"], (panel["title"], name)
        assert ds["isDefault"], "the datasource variable's default must be the provisioned Prometheus"
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert {"job", "namespace", "tier"} <= set(variables), path.name
        assert [i["type"] for i in dash["__inputs"]] == ["datasource"], "importable into any Grafana"
        for a in dash["annotations"]["list"]:
            if a.get("builtIn"):
                continue
            assert "expr" not in a and a["target"]["expr"] and a["datasource"] == DATASOURCE, a["name"]


def test_k8s_dashboard_configmap_is_the_dashboard() -> None:
    cm = k8s_by_kind("ConfigMap")["tierflow-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar loads
    dashboard = json.loads((GRAFANA / "dashboards" / "tierflow.json").read_text())
    assert json.loads(cm["data"]["tierflow.json"]) == dashboard, (
        "deploy/k8s/monitoring/grafana-dashboard.yaml is stale: python deploy/grafana/to_configmap.py")


def test_grafana_dashboard_queries_use_existing_metrics() -> None:
    for path, dash in _dashboards():
        exprs = {f"{path.name}: {p['title']} {t['refId']}": t["expr"]
                 for p in dash["panels"] for t in p.get("targets", [])}
        exprs |= {f"{path.name}: annotation {a['name']}": a["target"]["expr"]
                  for a in dash.get("annotations", {}).get("list", []) if "target" in a}
        exprs |= {f"{path.name}: variable {v['name']}": v["query"]["query"].removeprefix("label_values(").split(",")[0]
                  for v in dash["templating"]["list"] if v["type"] == "query"}
        assert_known_metrics(exprs)
        used = set().union(*(promql_metrics(e) for e in exprs.values()))
        for must in ("tierflow_routed_total", "tierflow_end_to_end_seconds_bucket", "tierflow_consumer_lag",
                     "tierflow_escalated_total", "tierflow_degraded_total", "tierflow_accuracy",
                     "tierflow_heavy_share", "tierflow_threshold", "tierflow_threshold_version",
                     "tierflow_dlq_total"):
            assert must in used, f"{path.name}: no panel shows {must}"


# --- image ---------------------------------------------------------------------------------------------


def test_image_pins_every_runtime_dependency_and_runs_as_non_root() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock: dict[str, str] = {}
    for line in (ROOT / "deploy" / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            lock[canonicalize_name(name)] = version
    dockerfile = (ROOT / "Dockerfile").read_text()
    torch_arg = re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    assert torch_arg, "Dockerfile: ARG TORCH_VERSION"
    lock["torch"] = torch_arg[1]
    for dep in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dep.name)
        assert name in lock, f"{name} is not pinned: python deploy/lock.py > deploy/requirements.lock"
        assert dep.specifier.contains(lock[name], prereleases=True), f"{name}=={lock[name]} breaks {dep}"
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", dockerfile, re.MULTILINE)
    users = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    uid = int(users[-1].split(":")[0])
    for _, doc in k8s_docs():
        if doc["kind"] == "Deployment":
            assert doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_the_resources_are_the_ones_docs_deploy_md_measured() -> None:
    """The requests and limits of each Deployment are the table in docs/deploy.md "Resources" (measured by
    deploy/resources.py): changing one without re-measuring, or the other, fails here."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    table = text[text.index("| role | 12 msg/s"):].split("\n\n", 1)[0].splitlines()[2:]
    documented = {}
    for row in table:
        role, *_, manifest = [c.strip() for c in row.strip("|").split("|")]
        requests, limits = manifest.split(" / ")
        cpu, memory = requests.split(", ")
        documented[role] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": limits.split(" ")[0]}}
    deployed = {}
    for name, dep in k8s_by_kind("Deployment").items():
        res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
        deployed[name.removeprefix("tierflow-")] = {"requests": res["requests"],
                                                    "limits": {"memory": res["limits"]["memory"]}}
    assert set(documented) == set(K8S_COMPONENTS) and deployed == documented

"""Every custom resource under deploy/ against the real CRD schemas of the operator versions docs/deploy.md names.

The schemas are vendored from the operators' own repositories (tests/data/crds/<operator>-<version>/, each with
its licence and the source URL in every file): only each served version's `openAPIV3Schema`. They are read as the
API server reads them under `kubectl apply` (strict field validation, the default since Kubernetes 1.27): an
unknown field is an error, `x-kubernetes-preserve-unknown-fields` opens an object, `x-kubernetes-int-or-string`
takes either, `nullable` takes null. An apiVersion the operator no longer serves fails here, as it fails there
(Strimzi 1.0 removed `kafka.strimzi.io/v1beta2`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import jsonschema
import pytest

from tests.unit.test_deploy import CUSTOM_KINDS, ROOT, k8s_docs

CRDS = ROOT / "tests" / "data" / "crds"
DOCS = ROOT / "docs" / "deploy.md"
OPERATORS = {"strimzi": "Strimzi", "keda": "KEDA", "prometheus-operator": "Prometheus operator"}


def structural(node: Any) -> Any:
    """An OpenAPI v3 structural schema (Kubernetes' dialect) as the JSON Schema the API server enforces."""
    if isinstance(node, list):
        return [structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: structural(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "properties" in node and "additionalProperties" not in node \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def vendored() -> dict[tuple[str, str], list[tuple[str, dict[str, Any]]]]:
    """(group, kind) -> [(operator-version, {served version: schema})] for every vendored CRD."""
    out: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(CRDS.glob("*/*.json")):
        crd = json.loads(path.read_text())
        out.setdefault((crd["group"], crd["kind"]), []).append((path.parent.name, crd["versions"]))
    return out


def custom_resources() -> list[tuple[str, dict[str, Any]]]:
    deploy = ROOT / "deploy"
    return [(f"{p.relative_to(ROOT)} {d['kind']}/{d['metadata']['name']}", d)
            for p, d in k8s_docs(deploy) if d.get("kind") in CUSTOM_KINDS]


@pytest.mark.parametrize(("where", "doc"), custom_resources(), ids=[w for w, _ in custom_resources()])
def test_custom_resource_validates_against_every_vendored_operator_version(where: str, doc: dict[str, Any]) -> None:
    group, _, version = doc["apiVersion"].partition("/")
    releases = vendored().get((group, doc["kind"]))
    assert releases, f"{where}: no CRD vendored for {group} {doc['kind']} under {CRDS.relative_to(ROOT)}"
    for release, versions in releases:
        assert version in versions, (f"{where}: {doc['apiVersion']} is not served by {release} "
                                     f"(it serves {', '.join(sorted(versions))})")
        errors = sorted(jsonschema.Draft7Validator(structural(versions[version])).iter_errors(doc),
                        key=lambda e: list(map(str, e.absolute_path)))
        assert not errors, f"{where} under {release}: " + "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:5])


def test_the_validation_rejects_what_the_api_server_rejects() -> None:
    """The converted schema is not a rubber stamp: an unknown field, a wrong type and a removed version fail."""
    (release, versions), *_ = vendored()[("kafka.strimzi.io", "KafkaTopic")]
    schema = structural(versions["v1"])
    good = {"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaTopic", "metadata": {"name": "t"},
            "spec": {"partitions": 3, "replicas": 3, "config": {"retention.ms": 1000}}}
    jsonschema.validate(good, schema)
    for bad in ({**good, "spec": {**good["spec"], "partitons": 3}},      # a typo: unknown field
                {**good, "spec": {**good["spec"], "partitions": "3"}}):  # a string for an integer
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert "v1beta2" not in versions, f"{release} still serves v1beta2: the test would not catch the removal"


def test_every_vendored_schema_carries_its_licence_and_source() -> None:
    for release in (d for d in CRDS.iterdir() if d.is_dir()):
        assert (release / "LICENSE").is_file(), release
        for path in release.glob("*.json"):
            assert json.loads(path.read_text())["source"].startswith("https://github.com/"), path


def test_docs_name_the_operator_versions_the_manifests_were_validated_against() -> None:
    text = DOCS.read_text()
    for release in sorted(d for d in CRDS.iterdir() if d.is_dir()):
        name, version = re.fullmatch(r"(.+)-(\d+\.\d+\.\d+)", release.name).groups()  # type: ignore[union-attr]
        assert f"{OPERATORS[name]} {version}" in text, f"docs/deploy.md does not name {OPERATORS[name]} {version}"


def test_every_custom_kind_deployed_has_a_vendored_schema() -> None:
    kinds = {d["kind"] for _, d in custom_resources()}
    assert kinds == CUSTOM_KINDS, kinds ^ CUSTOM_KINDS
    assert {k for _, k in vendored()} >= kinds

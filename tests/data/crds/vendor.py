"""Vendor an operator release's CRD schemas for tests/unit/test_deploy_crds.py.

    python tests/data/crds/vendor.py <git checkout of the operator> <tag> <dir in the repo> <name>-<version> FILE...

e.g. `vendor.py ~/src/strimzi-kafka-operator 1.2.0 install/cluster-operator strimzi-1.2.0 040-Crd-kafka.yaml
043-Crd-kafkatopic.yaml 045-Crd-kafkanodepool.yaml`. Keeps, per CRD, its group, kind and each served version's
`openAPIV3Schema` (what validation needs), the source URL, and the repository's LICENSE next to them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def main(repo: str, tag: str, base: str, name: str, *files: str) -> None:
    out = Path(__file__).parent / name
    out.mkdir(exist_ok=True)
    remote = subprocess.check_output(["git", "-C", repo, "remote", "get-url", "origin"], text=True).strip()
    slug = remote.removesuffix(".git").split("github.com")[-1].strip("/:")
    for f in files:
        crd = yaml.safe_load(subprocess.check_output(["git", "-C", repo, "show", f"{tag}:{base}/{f}"], text=True))
        slim = {"source": f"https://github.com/{slug}/blob/{tag}/{base}/{f}", "group": crd["spec"]["group"],
                "kind": crd["spec"]["names"]["kind"],
                "versions": {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                             if v.get("served")}}
        (out / (Path(f).stem + ".json")).write_text(json.dumps(slim, indent=1, sort_keys=True) + "\n")
    (out / "LICENSE").write_text(subprocess.check_output(["git", "-C", repo, "show", f"{tag}:LICENSE"], text=True))


if __name__ == "__main__":
    main(*sys.argv[1:])

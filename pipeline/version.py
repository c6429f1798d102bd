"""What build this is: the package version and the source commit, for `tierflow --version` and the
`tierflow_build_info` metric.

The commit is `TIERFLOW_BUILD_COMMIT` when set (an image build passes it: the image has no .git), else what git
says of the checkout the code runs from, else "unknown".
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path


@cache
def version() -> str:
    try:
        return metadata.version("tierflow")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


@cache
def commit() -> str:
    if env := os.environ.get("TIERFLOW_BUILD_COMMIT"):
        return env
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return "unknown"
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def describe() -> str:
    return f"tierflow {version()} (commit {commit()})"

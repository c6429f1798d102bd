"""The texts of the packs' data files, for the tests that keep evaluation sets apart from training data."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path


def texts_in(paths: Iterable[Path]) -> set[str]:
    """Every `text` of these CSV (a `text` column) and JSONL files."""
    seen: set[str] = set()
    for path in paths:
        if path.suffix == ".jsonl":
            seen |= {json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
        else:
            with path.open(newline="", encoding="utf-8") as f:
                seen |= {row["text"] for row in csv.DictReader(f)}
    return seen


def folded(text: str) -> str:
    """A text as the overlap checks compare it: whitespace runs as one space, case folded."""
    return " ".join(text.split()).casefold()

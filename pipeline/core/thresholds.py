"""The routing thresholds document: its fields and bounds, which of them the controller may tune, and how
an operator's text becomes a value. Pure: the store that keeps it in Redis is `pipeline.adapters.threshold_store`.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import InvalidThresholds


class Thresholds(BaseModel):
    """The routing and control document. Bounds are enforced on every write and every read."""

    # strict: a document in Redis is JSON written by us or by a person; `true` or "100" is a mistake, not 1 or 100
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: int = Field(1, ge=1)
    length_threshold: int = Field(50, ge=1, le=32_768, description="characters; longer -> heavy")
    escalate_below: float = Field(0.5, ge=0.0, le=1.0, description="light confidence below this -> heavy")
    shadow_rate: float = Field(0.0, ge=0.0, le=0.5, description="share of light traffic also run on heavy")
    heavy_budget: float = Field(0.25, ge=0.0, le=1.0, description="target max share of answers from heavy")
    # The defaults are bench.out_of_scope's operating point for the e-commerce pack (BENCHMARKS.md, "Knowing what it
    # does not know"): the best out-of-scope recall within 1 point of the in-scope accuracy without abstention.
    abstain_above: float = Field(0.25, ge=0.0, le=1.0,
                                 description="light out-of-scope score above this -> heavy (1: never)")
    handover_above: float = Field(0.5, ge=0.0, le=1.0,
                                  description="final out-of-scope score above this -> a person (1: never)")
    handover_budget: float = Field(0.10, ge=0.0, le=1.0, description="target max share of requests handed over")
    light_slo_p95_ms: float = Field(500.0, gt=0, le=600_000)
    heavy_slo_p95_ms: float = Field(3000.0, gt=0, le=600_000)
    min_accuracy: float = Field(0.85, ge=0.0, le=1.0)
    degrade_lag: int = Field(2000, ge=1, le=100_000_000, description="heavy lag that triggers degradation")
    recover_ratio: float = Field(0.5, gt=0.0, lt=1.0, description="recovery level as a share of the limits")
    recover_after_s: float = Field(3.0, ge=0.0, le=3600.0, description="calm time before routing back")
    # not strict: JSON has lists, not tuples
    pinned: tuple[str, ...] = Field((), strict=False, description="keys the feedback controller must not move")
    updated_at: float = 0.0
    updated_by: str = "default"
    reason: str = "initial defaults"
    inputs: dict[str, Any] = Field(default_factory=dict, description="window stats behind this change")

    @model_validator(mode="after")
    def _pins_exist(self) -> Thresholds:
        unknown = [p for p in self.pinned if p not in TUNABLE]
        if unknown:
            raise ValueError(f"cannot pin unknown keys: {', '.join(unknown)}")
        return self

    def changed(self, who: str, why: str, inputs: dict[str, Any] | None = None, **values: Any) -> Thresholds:
        """A new version with `values` applied; raises InvalidThresholds when a value breaks a bound."""
        data = self.model_dump()
        data.update(values)
        data.update(version=self.version + 1, updated_at=time.time(), updated_by=who, reason=why,
                    inputs=inputs or {})
        try:
            return Thresholds.model_validate(data)
        except ValidationError as e:
            raise InvalidThresholds(_first_error(e)) from None


META_KEYS = ("version", "pinned", "updated_at", "updated_by", "reason", "inputs")
TUNABLE = tuple(k for k in Thresholds.model_fields if k not in META_KEYS)


def _first_error(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else err["msg"]


def parse_value(key: str, text: str) -> Any:
    """A CLI string as the type of threshold `key` (`pinned` takes a comma list)."""
    if key == "pinned":
        return tuple(p for p in (s.strip() for s in text.split(",")) if p)
    if key not in TUNABLE:
        raise InvalidThresholds(f"unknown threshold {key!r}; known: {', '.join(TUNABLE)}")
    annotation = Thresholds.model_fields[key].annotation
    try:
        return int(text) if annotation is int else float(text)
    except ValueError:
        raise InvalidThresholds(f"{key}: {text!r} is not a number") from None


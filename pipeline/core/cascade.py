"""What a worker does with one prediction: answer the customer, escalate to heavy, or only report a result.

Pure: the worker loop feeds it the routed record's flags and the prediction's confidence and writes what it says.
Every stage always writes a result (the feedback agent's input); at most one stage writes the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.contracts.topics import Tier
from pipeline.core.routing import should_escalate

Kind = Literal["escalated", "replay", "stage"]  # how the worker's metrics count the record


@dataclass(frozen=True, slots=True)
class Outcome:
    escalate: bool  # forward to the heavy tier instead of answering
    final: bool  # this stage's result is the request's last (not escalated, not shadow)
    answer: bool  # write to the answers topic
    kind: Kind

    @property
    def answered(self) -> bool:
        """The record's latency counts as an answer's (the SLO's, the heartbeat's p95)."""
        return self.answer


def outcome(tier: Tier, confidence: float, escalate_below: float, *, shadow: bool = False, replay: bool = False,
            force: bool = False, degraded: bool = False, escalated: bool = False,
            fresh: bool | None = None) -> Outcome:
    """The outcome for one prediction.

    - Only the light tier escalates, once (`escalated`: the record came from light already), never a shadow run
      (it answers nobody) nor a degraded one (heavy is unhealthy: that is why it is here), and only below
      `escalate_below`.
    - A shadow run writes its result only.
    - A replayed request that an earlier replay already answered (`fresh` False) is not answered again unless the
      operator forced it (`force`); `fresh` None: unknown (Redis unreachable), answered (at least once).
    """
    escalate = (tier is Tier.LIGHT and not shadow and not escalated and not degraded
                and should_escalate(confidence, escalate_below))
    final = not escalate and not shadow
    answer = final and not (replay and not force and fresh is False)
    key = (escalate, final, answer, replay)
    o = _SEEN.get(key)
    if o is None:  # a handful of distinct outcomes: built once each, not once per message (the worker's hot path)
        kind: Kind = "escalated" if escalate else ("replay" if replay else "stage")
        o = _SEEN[key] = Outcome(escalate=escalate, final=final, answer=answer, kind=kind)
    return o


_SEEN: dict[tuple[bool, bool, bool, bool], Outcome] = {}

"""What a worker does with one prediction: answer the customer, escalate to heavy, hand over to a person, or only
report a result.

Pure: the worker loop feeds it the routed record's flags and thresholds and the prediction's confidence and
out-of-scope score, and writes what it says. Every stage always writes a result (the feedback agent's input); at
most one stage writes the answer.

The three outcomes of a prediction (issue 20): answer; escalate (light only: unsure, or abstaining because the
message looks out of its scope); abstain at the last stage, which hands the request over to a person: the answer
is a holding message and a hand-over record goes to the agents' desk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.contracts.topics import Tier
from pipeline.core.routing import should_escalate

Kind = Literal["escalated", "replay", "stage"]  # how the worker's metrics count the record

NEVER = 1.0  # a threshold no score is over: records from before the thresholds existed never abstain


@dataclass(frozen=True, slots=True)
class Outcome:
    escalate: bool  # forward to the heavy tier instead of answering
    final: bool  # this stage's result is the request's last (not escalated, not shadow)
    answer: bool  # write to the answers topic
    kind: Kind
    abstained: bool = False  # the out-of-scope score was over this stage's threshold
    handover: bool = False  # the answer is a holding message and a hand-over record goes out with it

    @property
    def answered(self) -> bool:
        """The record's latency counts as an answer's (the SLO's, the heartbeat's p95)."""
        return self.answer


def scope_score(stage_oos: float, light_oos: float | None = None) -> float:
    """The out-of-scope score a stage decides on: its own, or for a request light escalated, the mean of both
    tiers' (two models that err differently: on bench.out_of_scope's choosing half the mean caught more unknowns
    at the same in-scope accuracy than heavy's score alone, its max or its min)."""
    return stage_oos if light_oos is None else (stage_oos + light_oos) / 2.0


def abstains(oos_score: float, above: float) -> bool:
    """Out of scope for this stage: the score is over its threshold (a threshold of 1 never is)."""
    return oos_score > above


def outcome(tier: Tier, confidence: float, escalate_below: float, *, shadow: bool = False, replay: bool = False,
            force: bool = False, degraded: bool = False, escalated: bool = False,
            fresh: bool | None = None, oos_score: float = 0.0, abstain_above: float = NEVER,
            handover_above: float = NEVER, small_talk: bool = False, restated: bool = False,
            handover_wanted: bool = False) -> Outcome:
    """The outcome for one prediction.

    - Only the light tier escalates, once (`escalated`: the record came from light already), never a shadow run
      (it answers nobody) nor a degraded one (heavy is unhealthy: that is why it is here), and only below
      `escalate_below` or, abstaining, with an out-of-scope score over `abstain_above`.
    - A stage that does not escalate is the last one: over `handover_above` it hands the request over (a light
      stage that cannot escalate, being degraded, too: a person answers better than a guess).
    - Small talk (chit-chat is the model's top label) never abstains nor is handed over: people are for the
      business's questions. Unsure small talk still escalates (short shop questions, "my parcel", can look like
      it to the light model).
    - In a conversation (pipeline/core/conversation.py): light escalates a message that `restated` the open topic
      (its answer did not help), and the last stage hands over one whose conversation asks for a person
      (`handover_wanted`).
    - A shadow run writes its result only.
    - A replayed request that an earlier replay already answered (`fresh` False) is not answered again unless the
      operator forced it (`force`); `fresh` None: unknown (Redis unreachable), answered (at least once).
    """
    can_escalate = tier is Tier.LIGHT and not shadow and not escalated and not degraded
    light_abstains = can_escalate and abstains(oos_score, abstain_above)
    escalate = can_escalate and (light_abstains or restated or should_escalate(confidence, escalate_below))
    final = not escalate and not shadow
    answer = final and not (replay and not force and fresh is False)
    last_abstains = not escalate and not small_talk and abstains(oos_score, handover_above)
    handover = answer and (last_abstains or (handover_wanted and not escalate))
    key = (escalate, final, answer, replay, light_abstains or last_abstains, handover)
    o = _SEEN.get(key)
    if o is None:  # a handful of distinct outcomes: built once each, not once per message (the worker's hot path)
        kind: Kind = "escalated" if escalate else ("replay" if replay else "stage")
        o = _SEEN[key] = Outcome(escalate=escalate, final=final, answer=answer, kind=kind,
                                 abstained=key[4], handover=handover)
    return o


_SEEN: dict[tuple[bool, bool, bool, bool, bool, bool], Outcome] = {}

"""The worker's cascade outcome over its whole truth table: tier x shadow x replay x force x degraded x escalated x
confidence x whether an earlier replay answered the id. No broker: the outcome is a pure function."""

from __future__ import annotations

import itertools

import pytest

from pipeline.contracts.topics import Tier
from pipeline.core.cascade import NEVER, Outcome, outcome, scope_score

BELOW = 0.5
FLAGS = ("shadow", "replay", "force", "degraded", "escalated")
CASES = [(tier, conf, fresh, dict(zip(FLAGS, bits, strict=True)))
         for tier in Tier for conf in (0.2, 0.5, 0.9) for fresh in (True, False, None)
         for bits in itertools.product((False, True), repeat=len(FLAGS))]


@pytest.mark.parametrize(("tier", "conf", "fresh", "flags"), CASES)
def test_every_combination_obeys_the_cascade_rules(tier: Tier, conf: float, fresh: bool | None,
                                                   flags: dict[str, bool]) -> None:
    o = outcome(tier, conf, BELOW, fresh=fresh, **flags)
    # exactly one of: escalate, answer, result only
    assert not (o.escalate and o.answer)
    assert o.final == (not o.escalate and not flags["shadow"])
    assert o.answered == o.answer
    # who escalates: light, unsure, first pass, not a shadow run, not degraded (heavy is the unhealthy one)
    assert o.escalate == (tier is Tier.LIGHT and conf < BELOW and not flags["shadow"] and not flags["escalated"]
                          and not flags["degraded"])
    # a shadow run answers nobody
    if flags["shadow"]:
        assert not o.answer and not o.escalate
    # a replayed id an earlier replay answered gets a result, not a second answer, unless forced
    if flags["replay"] and fresh is False and not flags["force"]:
        assert not o.answer
    # anything else that is final is answered: live traffic never loses its answer to the replay bookkeeping
    if o.final and not flags["replay"]:
        assert o.answer
    assert o.kind == ("escalated" if o.escalate else "replay" if flags["replay"] else "stage")


@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    # the rows a reader checks first, spelled out
    ((Tier.LIGHT, 0.9, BELOW), {}, Outcome(escalate=False, final=True, answer=True, kind="stage")),
    ((Tier.LIGHT, 0.2, BELOW), {}, Outcome(escalate=True, final=False, answer=False, kind="escalated")),
    ((Tier.LIGHT, 0.5, BELOW), {}, Outcome(escalate=False, final=True, answer=True, kind="stage")),  # not below
    ((Tier.HEAVY, 0.2, BELOW), {"escalated": True}, Outcome(False, True, True, "stage")),  # heavy always answers
    ((Tier.LIGHT, 0.2, BELOW), {"degraded": True}, Outcome(False, True, True, "stage")),
    ((Tier.LIGHT, 0.2, BELOW), {"shadow": True}, Outcome(False, False, False, "stage")),
    ((Tier.HEAVY, 0.9, BELOW), {"replay": True, "fresh": False}, Outcome(False, True, False, "replay")),
    ((Tier.HEAVY, 0.9, BELOW), {"replay": True, "fresh": False, "force": True}, Outcome(False, True, True, "replay")),
    ((Tier.HEAVY, 0.9, BELOW), {"replay": True, "fresh": None}, Outcome(False, True, True, "replay")),
    ((Tier.LIGHT, 0.2, BELOW), {"replay": True, "fresh": False}, Outcome(True, False, False, "escalated")),
    ((Tier.MULTIMODAL, 0.1, BELOW), {}, Outcome(False, True, True, "stage")),
])
def test_the_named_rows(args: tuple[Tier, float, float], kwargs: dict[str, bool | None], expected: Outcome) -> None:
    assert outcome(*args, **kwargs) == expected  # type: ignore[arg-type]


# --------------------------------------------------------------------------- out of scope (issue 20)
def test_a_confident_light_answer_out_of_scope_abstains_to_heavy() -> None:
    o = outcome(Tier.LIGHT, 0.95, 0.5, oos_score=0.8, abstain_above=0.6, handover_above=0.7)
    assert (o.escalate, o.abstained, o.answer, o.handover) == (True, True, False, False)


def test_heavy_over_its_threshold_hands_over_and_under_it_answers() -> None:
    over = outcome(Tier.HEAVY, 0.9, 0.5, escalated=True, oos_score=0.71, handover_above=0.7)
    under = outcome(Tier.HEAVY, 0.9, 0.5, escalated=True, oos_score=0.69, handover_above=0.7)
    assert (over.answer, over.handover, over.abstained, over.escalate) == (True, True, True, False)
    assert (under.answer, under.handover, under.abstained) == (True, False, False)


def test_a_threshold_of_one_never_abstains_nor_hands_over() -> None:
    """Records from before the thresholds existed (absent fields read as NEVER) behave as they did."""
    for tier in Tier:
        o = outcome(tier, 0.9, 0.5, oos_score=1.0, abstain_above=NEVER, handover_above=NEVER)
        assert not o.abstained and not o.handover


def test_light_that_cannot_escalate_hands_over_itself() -> None:
    """Degraded (heavy unhealthy): a person answers better than a guess."""
    o = outcome(Tier.LIGHT, 0.9, 0.5, degraded=True, oos_score=0.9, abstain_above=0.5, handover_above=0.7)
    assert (o.escalate, o.answer, o.handover) == (False, True, True)


def test_shadows_and_answered_replays_never_hand_over() -> None:
    shadow = outcome(Tier.HEAVY, 0.9, 0.5, shadow=True, oos_score=0.9, handover_above=0.5)
    assert (shadow.answer, shadow.handover, shadow.abstained) == (False, False, True)
    again = outcome(Tier.HEAVY, 0.9, 0.5, replay=True, fresh=False, oos_score=0.9, handover_above=0.5)
    assert (again.answer, again.handover) == (False, False)
    first = outcome(Tier.HEAVY, 0.9, 0.5, replay=True, fresh=True, oos_score=0.9, handover_above=0.5)
    assert (first.answer, first.handover) == (True, True)


def test_small_talk_is_never_handed_over_and_escalates_only_when_unsure() -> None:
    """Chit-chat on top: no stage abstains on it nor hands it over; light escalates it only below escalate_below."""
    sure = outcome(Tier.LIGHT, 0.8, 0.5, oos_score=0.0, abstain_above=0.1, handover_above=0.1, small_talk=True)
    assert (sure.escalate, sure.answer, sure.handover, sure.abstained) == (False, True, False, False)
    unsure = outcome(Tier.LIGHT, 0.3, 0.5, oos_score=0.0, abstain_above=0.1, handover_above=0.1, small_talk=True)
    assert (unsure.escalate, unsure.abstained) == (True, False)
    degraded = outcome(Tier.LIGHT, 0.3, 0.5, degraded=True, oos_score=0.9, handover_above=0.1, small_talk=True)
    assert (degraded.answer, degraded.handover) == (True, False)
    heavy = outcome(Tier.HEAVY, 0.2, 0.5, escalated=True, oos_score=0.9, handover_above=0.1, small_talk=True)
    assert (heavy.answer, heavy.handover) == (True, False)


def test_an_escalated_request_is_judged_on_both_tiers_scores() -> None:
    assert scope_score(0.8) == 0.8
    assert scope_score(0.8, 0.4) == pytest.approx(0.6)

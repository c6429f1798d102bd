"""The core budget: model agents share TIERFLOW_CPUS by weight, each with at least one thread."""

from __future__ import annotations

from pipeline.core.budget import split_cores

AGENTS = ["ingest", "worker-light", "worker-heavy", "worker-multimodal", "feedback"]


def test_on_two_cores_every_model_agent_gets_one_thread() -> None:
    assert split_cores(2, AGENTS) == {a: 1 for a in AGENTS}


def test_spare_cores_go_by_weight_and_the_model_threads_sum_to_the_budget() -> None:
    got = split_cores(8, AGENTS)
    models = {a: n for a, n in got.items() if a.startswith("worker")}
    assert sum(models.values()) == 8
    assert models == {"worker-heavy": 4, "worker-light": 2, "worker-multimodal": 2}
    assert got["ingest"] == got["feedback"] == 1


def test_a_remainder_goes_to_the_heaviest_first() -> None:
    got = split_cores(4, AGENTS)
    assert got["worker-heavy"] == 2 and got["worker-light"] == 1 and got["worker-multimodal"] == 1
    assert sum(n for a, n in got.items() if a.startswith("worker")) == 4


def test_the_trainer_takes_a_share_when_it_runs() -> None:
    got = split_cores(10, [*AGENTS, "trainer"])
    assert sum(n for a, n in got.items() if a != "ingest" and a != "feedback") == 10
    assert got["trainer"] >= 1 and got["worker-heavy"] > got["worker-light"]

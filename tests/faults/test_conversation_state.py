"""Conversations under faults (issue 35): 1,000 customers interleaved on the same partitions, a second light
worker joining (a rebalance) and the first killed with kill -9 between their turns. Every customer's next turn
still sees their own earlier turns, and no customer's answer names another customer's order.

Echo models (as every fault test): what is checked is the state, not the classifiers; the order a customer named
in their first turn comes back in their second turn's answer only through their conversation.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson
import pytest

from pipeline.adapters.conversations import Conversations
from pipeline.adapters.kafka import topics_of
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import Keys
from pipeline.settings import Settings
from tests.faults.harness import AGENT_ARGS, Agents
from tests.integration.helpers import produce_all, reader, wait_ready

pytestmark = pytest.mark.integration

CUSTOMERS = 1000


def order_of(i: int) -> str:
    return f"{700000 + i * 13}"  # 6 digits, distinct per customer


def send(s: Settings, turn: int, text: Callable[[int], str]) -> set[str]:
    reqs = [{"id": f"k{i}-t{turn}", "user_id": f"cust-{i}", "text": text(i)} for i in range(CUSTOMERS)]
    produce_all(s, topics_of(s).requests, [orjson.dumps(r) for r in reqs], keys=[r["user_id"] for r in reqs])
    return {r["id"] for r in reqs}


def test_a_thousand_customers_keep_their_own_turns_across_a_rebalance_and_a_kill(
        settings_factory: Callable[..., Settings]) -> None:
    s = settings_factory()
    agents = Agents(s).start("ingest", "worker-light", "worker-heavy", "worker-multimodal")
    answers = reader(s, topics_of(s).answers)
    got: dict[str, dict[str, object]] = {}

    def wait(ids: set[str], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not ids <= got.keys() and time.monotonic() < deadline:
            for m in answers.consume(1000, 0.5):
                if m.error() is None and m.value():
                    a = orjson.loads(m.value() or b"{}")
                    got[a["request_id"]] = a
        assert ids <= got.keys(), f"{len(ids - got.keys())} not answered; light: {agents.log('worker-light')[-800:]}"

    try:
        wait_ready(s, ["light", "heavy", "multimodal"])
        wait(send(s, 1, lambda i: f"cancel order {order_of(i)}"))
        # a rebalance (a second light worker joins), and the first light worker killed (kill -9) and restarted:
        # the conversations are not in the workers
        agents.stack.start_agent("worker-light-2", *AGENT_ARGS["worker-light"], env=agents.env)
        time.sleep(3.0)
        agents.kill("worker-light")
        agents.start("worker-light")  # restarted as `tierflow up` would: it comes back holding nothing
        wait(send(s, 2, lambda i: "is there a fee?"), timeout=180.0)
        leaks, lost = [], []
        orders = [order_of(i) for i in range(CUSTOMERS)]
        for i in range(CUSTOMERS):
            a = got[f"k{i}-t2"]
            text = str(a["answer"])
            if a.get("turn") != 2 or orders[i] not in text:
                lost.append((i, a.get("turn"), text[:80]))
            named = [o for o in orders if o in text and o != orders[i]]
            if named:
                leaks.append((i, named))
        assert not leaks, f"{len(leaks)} answers name another customer's order, e.g. {leaks[:3]}"
        assert not lost, f"{len(lost)} second turns without their first, e.g. {lost[:3]}"
        store = Conversations(make_redis(s), Keys(s.redis.prefix), s.conversation, "test")
        sizes = [len(store.turns(f"cust-{i}")) for i in range(0, CUSTOMERS, 50)]
        assert sizes == [2] * len(sizes), sizes
        assert not agents.dead(), agents.dead()
    finally:
        answers.close()
        agents.stop()

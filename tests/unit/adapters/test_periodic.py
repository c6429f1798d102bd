"""Periodic: the one background-thread shape (heartbeats, health monitor, threshold cache)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from pipeline.adapters.periodic import Periodic


def test_it_calls_the_function_every_interval_until_closed() -> None:
    calls: list[float] = []
    p = Periodic("t", 0.02, lambda: calls.append(time.monotonic())).start()
    deadline = time.monotonic() + 5
    while len(calls) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    assert len(calls) >= 5
    assert not p.alive
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n, "called after close"


def test_the_first_call_comes_one_interval_after_start() -> None:
    calls: list[float] = []
    started = time.monotonic()
    p = Periodic("t", 0.2, lambda: calls.append(time.monotonic())).start()
    time.sleep(0.1)
    assert calls == []
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    assert calls and calls[0] - started >= 0.2


def test_an_exception_is_logged_and_the_calls_go_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="pipeline.adapters.periodic"):
        p = Periodic("flaky", 0.01, flaky).start()
        deadline = time.monotonic() + 5
        while calls < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        p.close()
    assert calls >= 6, "the thread died on an exception"
    failures = [r for r in caplog.records if "flaky: background call failed" in r.getMessage()]
    assert len(failures) == 1, "one traceback per 10 s, not one per failed call"
    assert failures[0].exc_info is not None and "boom" in str(failures[0].exc_info[1])


def test_close_is_prompt_with_a_long_interval() -> None:
    p = Periodic("slow", 60.0, lambda: None).start()
    t0 = time.monotonic()
    p.close()
    assert time.monotonic() - t0 < 0.5
    assert not p.alive


def test_close_waits_for_a_call_in_progress_and_on_exit_runs_in_the_thread() -> None:
    entered, finished = threading.Event(), threading.Event()
    exited: list[str] = []

    def slow() -> None:
        entered.set()
        time.sleep(0.2)
        finished.set()

    p = Periodic("busy", 0.0, slow, on_exit=lambda: exited.append(threading.current_thread().name)).start()
    assert entered.wait(5)
    p.close()
    assert finished.is_set(), "close returned while a call was still running"
    assert exited == ["busy"]


def test_close_gives_up_on_a_stuck_call_after_its_timeout() -> None:
    release = threading.Event()
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(10)

    p = Periodic("stuck", 0.0, stuck).start()
    assert entered.wait(5)
    t0 = time.monotonic()
    p.close(timeout_s=0.1)
    assert time.monotonic() - t0 < 1.0
    release.set()

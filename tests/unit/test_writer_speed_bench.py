"""bench.writer_speed's pure parts: the configurations a user names, and the verdict it writes."""

from __future__ import annotations

import pytest

from bench.writer_speed import Config, conclusion


def test_a_configuration_is_model_threads_and_optional_drafts() -> None:
    assert Config.parse("qwen:1") == Config("qwen", 1, False)
    assert Config.parse(" smollm2:2:draft ") == Config("smollm2", 2, True)
    assert Config.parse("qwen:2").label == "Qwen2.5-1.5B, 2 threads"


@pytest.mark.parametrize("bad", ["qwen", "llama:1", "qwen:one", "qwen:1:fast", "qwen:1:draft:x"])
def test_a_bad_configuration_is_refused_in_one_line(bad: str) -> None:
    with pytest.raises(SystemExit, match="is not model:threads\\[:draft\\]"):
        Config.parse(bad)


def test_the_verdict_names_the_nearest_configuration_and_what_it_still_needs() -> None:
    one, two, small = Config("qwen", 1, False), Config("qwen", 2, False), Config("smollm2", 1, False)
    # (config, first sentence p50, whole p50, whole p95, share sent as written)
    text = conclusion([(one, 6.2, 7.8, 13.7, 0.72), (two, 4.4, 6.1, 10.8, 0.72), (small, 2.2, 4.7, 6.2, 0.28)])
    assert text.startswith("What would meet them: none of these. Qwen2.5-1.5B, 1 thread needs a writer 6.2x faster")
    assert "whole reply p50 against it: Qwen2.5-1.5B, 2 threads 1.28x; SmolLM2-135M, 1 thread 1.66x" in text
    assert "Nearest on latency: SmolLM2-135M, 1 thread, still 2.2x short, and it sends 28% as written against 72%" \
        in text
    assert conclusion([(one, 0.8, 2.0, 4.0, 0.95)]) == "What would meet them: Qwen2.5-1.5B, 1 thread."
    assert conclusion([]) == ""

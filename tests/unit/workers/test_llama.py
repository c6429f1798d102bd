"""The llama.cpp generator: the packaged Qwen GGUF's integrity check, and real grounded replies from the real model.

The integrity tests use small part files made here. The model tests load Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) with
xllamacpp on the CPU (both come with `make demo`'s install; they skip, saying why, where they are absent).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from workers.model import Item, Prediction
from workers.models.generator import GeneratedAnswers, smollm2_gguf
from workers.models.llama import LlamaCppGenerator, assemble, gpu_backend, qwen_gguf, verified
from workers.models.prompts import Fact, GenerationRequest, Generator, in_language, missing_facts

EN_POLICY = "Unworn items can be returned within 30 days of delivery for a full refund."
ZH_POLICY = "未穿过的商品可在签收后30天内退货并全额退款。"
EN = GenerationRequest("Can I still return the shoes I bought two weeks ago? I never wore them.", "en",
                       "return_policy", EN_POLICY, (Fact(("30 days", "30-day", "thirty days")),))
ZH = GenerationRequest("我两周前买的鞋子还没穿过，还能退货吗？", "zh", "return_policy", ZH_POLICY,
                       (Fact(("30天", "三十天")),))


def _parts(tmp_path: Path, chunks: list[bytes]) -> list[Path]:
    paths = []
    for i, chunk in enumerate(chunks, 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(chunk)
        paths.append(p)
    return paths


def test_assembled_file_matching_its_sha256_is_kept(tmp_path: Path) -> None:
    chunks = [b"GGUF" + bytes(range(200)), b"tail" * 50]
    want = hashlib.sha256(b"".join(chunks)).hexdigest()
    dest = assemble(_parts(tmp_path, chunks), tmp_path / "cache" / "m.gguf", want)
    assert dest.read_bytes() == b"".join(chunks)
    assert verified(dest, want) == dest


def test_corrupted_part_fails_the_sha256_check_and_leaves_no_file(tmp_path: Path) -> None:
    chunks = [b"GGUF" + bytes(range(200)), b"tail" * 50]
    want = hashlib.sha256(b"".join(chunks)).hexdigest()
    parts = _parts(tmp_path, [chunks[0], b"tajl" * 50])  # one flipped byte in the second part
    with pytest.raises(ConfigError, match="sha256"):
        assemble(parts, tmp_path / "cache" / "m.gguf", want)
    assert list((tmp_path / "cache").iterdir()) == []  # neither the model nor a half-written temp file


def test_file_changed_after_its_check_is_hashed_again_and_rejected(tmp_path: Path) -> None:
    chunks = [b"GGUF" + bytes(range(200))]
    want = hashlib.sha256(chunks[0]).hexdigest()
    dest = assemble(_parts(tmp_path, chunks), tmp_path / "m.gguf", want)
    dest.write_bytes(b"GGUF" + bytes(range(199)) + b"\x00")  # same size, other bytes: a corrupted copy
    with pytest.raises(ConfigError, match="sha256"):
        verified(dest, want)


def test_missing_binding_is_a_config_error_naming_the_install(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # import xllamacpp now raises ImportError
    gen = LlamaCppGenerator(tmp_path / "m.gguf", 8)
    with pytest.raises(ConfigError, match="needs xllamacpp: make demo installs it"):
        gen.setup("cpu")


def test_a_cpu_only_build_has_no_gpu_backend() -> None:
    cpu = {"name": "CPU", "type": "ggml_backend_dev_type.GGML_BACKEND_DEVICE_TYPE_CPU"}
    cuda = {"name": "CUDA0", "type": "ggml_backend_dev_type.GGML_BACKEND_DEVICE_TYPE_GPU"}
    igpu = {"name": "Vulkan0", "type": "ggml_backend_dev_type.GGML_BACKEND_DEVICE_TYPE_IGPU"}
    assert gpu_backend([cpu]) is None and gpu_backend([cpu, igpu]) is None
    assert gpu_backend([cpu, cuda]) == "CUDA0"


@pytest.fixture(scope="module")
def qwen() -> Iterator[LlamaCppGenerator]:
    """The packaged Qwen2.5-Coder-1.5B-Instruct on the CPU, loaded once for the module."""
    pytest.importorskip("xllamacpp", reason="xllamacpp is not installed (make demo installs it)")
    try:
        path = qwen_gguf()
    except ConfigError as e:
        pytest.skip(f"the Qwen GGUF is not installed: {e}")
    # One thread: on 2 shared cores a second llama.cpp thread waits on the other process and decodes slower.
    gen = LlamaCppGenerator(path, max_new_tokens=64, name="qwen2.5-coder-1.5b", threads=1,
                            timeout_s=300.0)  # generous: only the time-budget test is about the clock
    gen.setup("cpu")
    yield gen


# The tests run in file order and share one model: each starts with the prompt the one before it ended on, so
# llama.cpp's prompt cache skips that prefill (~4 s each on a 2-core CPU).


def test_grounded_replies_keep_the_fact_in_the_customers_language(qwen: LlamaCppGenerator) -> None:
    assert isinstance(qwen, Generator)
    zh, en = qwen.generate([ZH, EN])
    assert in_language(zh, "zh") and not missing_facts(zh, ZH.facts), zh
    assert in_language(en, "en") and not missing_facts(en, EN.facts), en
    assert qwen.last_stats is not None and qwen.last_stats.sequences == 2 and qwen.last_stats.new_tokens > 0
    assert all(r.first_token_s is not None and r.first_token_s <= r.seconds for r in qwen.last_replies)


def test_the_reply_streams_as_it_is_written_and_reuses_the_cached_prompt(qwen: LlamaCppGenerator) -> None:
    seen: list[tuple[int, str]] = []
    (text,) = qwen.generate([EN], on_text=lambda i, so_far: seen.append((i, so_far)))
    assert len(seen) > 1 and {i for i, _ in seen} == {0}
    assert all(b.startswith(a) for (_, a), (_, b) in itertools.pairwise(seen))  # each one grows the last
    assert text and seen[-1][1].strip().startswith(text[:20])
    (reply,) = qwen.last_replies
    # The test before ended on this very prompt: all of it but the last token comes from the cache.
    assert reply.cached_tokens >= reply.prompt_tokens - 1 > 0


def test_token_budget_bounds_the_reply(qwen: LlamaCppGenerator) -> None:
    qwen.max_new_tokens = 6
    try:
        (text,) = qwen.generate([EN])
    finally:
        qwen.max_new_tokens = 64
    (reply,) = qwen.last_replies
    assert reply.outcome == "length" and reply.new_tokens == 6
    assert 0 < len(text.split()) <= 6


def test_requests_past_the_time_budget_get_no_reply(qwen: LlamaCppGenerator) -> None:
    qwen.timeout_s = 0.5  # less than a whole reply takes on a CPU: the first is cut mid-reply, the second never starts
    qwen.reply_seconds.clear()  # no reply seen yet: the first is started whatever its time left
    try:
        texts = qwen.generate([EN, ZH])
    finally:
        qwen.timeout_s = 300.0
    assert texts == ["", ""]
    cut, skipped = qwen.last_replies
    assert (cut.outcome, skipped.outcome) == ("cut", "skipped")
    assert cut.new_tokens < 64
    # Stopped at the first token past the deadline (a prefill in progress cannot be interrupted; this one was cached).
    # The slack is one token on a machine loaded several times over; 64 tokens take 8 s on two idle cores.
    assert qwen.last_stats is not None and qwen.last_stats.seconds < 0.5 + 5.0


def test_a_prompt_over_the_context_window_gets_no_reply_and_spares_the_others(qwen: LlamaCppGenerator) -> None:
    long = GenerationRequest(EN.text, "en", "return_policy", "Unworn items can be returned. " * 400)
    qwen.max_new_tokens = 4  # the second reply only has to exist
    try:
        texts = qwen.generate([long, EN])
    finally:
        qwen.max_new_tokens = 64
    assert texts[0] == "" and texts[1]
    assert [r.outcome for r in qwen.last_replies] == ["overlong", "length"]



class _ReturnsPolicy:
    """A classifier that reads every message as the return policy question (the writer is under test)."""

    name = "returns"

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        return [Prediction("return_policy", 0.9, EN_POLICY if it.lang == "en" else ZH_POLICY, self.name)
                for it in batch]


def test_a_request_s_own_deadline_bounds_its_reply_and_an_unreachable_one_is_not_started(
        qwen: LlamaCppGenerator) -> None:
    qwen.reply_seconds.clear()
    qwen.reply_seconds.append(2.0)  # the quickest recent reply took 2 s
    soon = dataclasses.replace(EN, deadline=time.time() + 1.0)  # less than that left: not worth starting
    later = dataclasses.replace(ZH, deadline=time.time() + 300.0)
    texts = qwen.generate([soon, later])
    assert texts[0] == "" and texts[1]
    assert [r.outcome for r in qwen.last_replies] == ["skipped", "stop"]
    # A live message that waited out the writer's budget (30 s) in the queue: the template at once, saying why.
    model = GeneratedAnswers(_ReturnsPolicy(), qwen, budget_s=30.0)
    (pred,) = model.predict([Item(EN.text, "en", received_ms=int((time.time() - 60.0) * 1000))])
    assert (pred.fallback, pred.answer) == ("timeout", EN_POLICY)
    assert qwen.last_replies[0].outcome == "skipped"


def test_a_writer_told_that_messages_wait_stops_and_its_batch_gets_the_templates(qwen: LlamaCppGenerator) -> None:
    qwen.reply_seconds.clear()
    model = GeneratedAnswers(_ReturnsPolicy(), qwen, max_held=0.5)
    model.queue_probe = lambda: (lambda: 1)  # a message reached the tier once writing began
    (pred,) = model.predict([Item(EN.text, "en")])
    assert (pred.fallback, pred.answer) == ("busy", EN_POLICY)
    (reply,) = qwen.last_replies
    assert reply.outcome == "yielded" and reply.new_tokens < 64
    assert qwen.interrupt is None  # the next call writes unless told again


def test_a_prefill_is_stopped_between_its_chunks(qwen: LlamaCppGenerator) -> None:
    # A prompt no earlier test read (nothing cached), several chunks long: told at once that messages wait, the
    # writer stops while reading it, before any token is written.
    fresh = dataclasses.replace(EN, text="I ordered a blue jacket in size M, but a red one in size L came. " * 4,
                                reference=EN_POLICY * 3)
    qwen.interrupt = lambda: True
    try:
        assert qwen.generate([fresh]) == [""]
    finally:
        qwen.interrupt = None
    (reply,) = qwen.last_replies
    assert reply.outcome == "yielded" and reply.first_token_s is None and reply.new_tokens == 0


def test_n_gram_drafts_are_guessed_and_checked_by_the_model() -> None:
    # SmolLM2-135M (seconds to load): the drafts are the runtime's, whatever the weights. A reply that quotes its
    # policy finds its last 3 tokens earlier in the prompt, so llama.cpp guesses the next ones from there.
    pytest.importorskip("xllamacpp", reason="xllamacpp is not installed (make demo installs it)")
    try:
        path = smollm2_gguf()
    except ConfigError as e:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {e}")
    gen = LlamaCppGenerator(path, max_new_tokens=48, threads=1, timeout_s=120.0, draft_ngram=(3, 8))
    gen.setup("cpu")
    quote = dataclasses.replace(EN, text="Please quote your returns policy to me word for word.")
    (text,) = gen.generate([quote])
    (reply,) = gen.last_replies
    assert text and reply.outcome in ("stop", "length")
    assert reply.drafted > 0 and 0 <= reply.accepted <= reply.drafted

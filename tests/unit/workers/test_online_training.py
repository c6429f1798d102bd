"""The trainer's retraining child (workers/training/online.py) with cross-fitting: real fits on a small set."""

from __future__ import annotations

import random

from workers.training.data import Dataset
from workers.training.online import train_light

LABELS = ["track_order", "cancel_order", "get_refund", "change_address"]
WORDS = {"track_order": ["where", "track", "parcel", "arrive"], "cancel_order": ["cancel", "stop", "undo", "abort"],
         "get_refund": ["refund", "money", "back", "reimburse"]}


def data(n: int, rnd: random.Random) -> Dataset:
    texts, labels = [], []
    for intent, words in WORDS.items():
        for i in range(n):
            texts.append(f"{rnd.choice(words)} {rnd.choice(words)} my order number {rnd.randrange(10_000)} {i}")
            labels.append(intent)
    return Dataset(texts, labels)


def test_each_fold_is_answered_by_a_model_that_never_saw_it() -> None:
    rnd = random.Random(0)
    seed, examples = data(10, rnd), data(20, rnd)
    # one intent only the examples of fold 0 teach: the model fitted without fold 0 cannot know it
    only = [f"please change the delivery address {i} now" for i in range(8)]
    examples = Dataset(examples.texts + only, examples.labels + ["change_address"] * len(only))
    folds: list[int | None] = [None if i % 4 == 0 else i % 3 for i in range(len(examples.texts) - len(only))]
    folds += [0] * len(only)
    weights, report = train_light(seed, examples, LABELS, 0, folds)
    predicted = report["crossfit"]
    assert [p is None for p in predicted] == [f is None for f in folds]
    assert all(p != "change_address" for p in predicted[-len(only):])  # never trained on them
    right = [p == c for p, c, f in zip(predicted, examples.labels, folds, strict=True) if f is not None
             and c != "change_address"]
    assert sum(right) / len(right) > 0.9  # the other intents are learned from the other folds
    assert report["crossfit_seconds"] >= 0 and weights


def test_without_folds_the_report_has_no_crossfit_and_the_weights_are_the_same() -> None:
    rnd = random.Random(1)
    seed, examples = data(10, rnd), data(10, rnd)
    plain, report = train_light(seed, examples, LABELS, 0)
    folded, _ = train_light(seed, examples, LABELS, 0, [i % 2 for i in range(len(examples.texts))])
    assert "crossfit" not in report and plain == folded  # cross-fitting never changes the candidate

"""A blind side-by-side: the heavy tier's written replies against the templates they replace.

    python -m bench.side_by_side pairs --n 20 --out pairs.jsonl     # write 20 pairs, each in a random order
    (a judge reads pairs.jsonl: each line holds the customer's message, the policy and replies "A" and "B", and writes
     verdicts.json: {"<id>": {"better": "A" | "B" | "same", "why": "..."}, ...}, not knowing which reply is which)
    python -m bench.side_by_side score --pairs pairs.jsonl --verdicts verdicts.json --write

Messages: the e-commerce check set in a fixed random order (seed 1), the first `n` whose written reply the guard sends
(`workers.models.generator.guarded`): only those reach a customer; a fallback is the template, nothing to compare.
The template is the intent's policy text, as the light tier and a fallback send it. Which side is the written
reply is drawn per pair (seed 2) and kept in the pairs file's `key`, which the judge must not be shown: `score`
`pairs` also writes the file the judge reads (`<out>.blind.jsonl`, without `key`); `score` unblinds the verdicts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.common import write_section
from pipeline.contracts.topics import Tier
from pipeline.settings import Settings
from workers.domains import load_domain
from workers.model import Item, checked_predict
from workers.models.generator import GeneratedAnswers, guarded

TITLE = "The writer against the templates, judged blind"
VERDICTS = ("A", "B", "same")


def pairs(n: int) -> list[dict[str, str]]:
    """`n` check-set messages with a sent written reply and the template, in a random order per pair."""
    from workers.models.registry import generator_from_settings, tier_model

    s = Settings(domain="ecommerce", heavy_generator="qwen")
    domain = load_domain("ecommerce")
    assert domain.check is not None
    rows = [json.loads(x) for x in domain.check.read_text(encoding="utf-8").splitlines() if x.strip()]
    for i, r in enumerate(rows):
        r["id"] = f"check-{i:03d}"
    random.Random(1).shuffle(rows)
    classifier = tier_model(s.updated(heavy_generator=None), Tier.HEAVY)
    gen = generator_from_settings(s)
    model = GeneratedAnswers(classifier, gen, domain)
    model.setup("cpu")
    side = random.Random(2)
    out: list[dict[str, str]] = []
    for r in rows:
        if len(out) >= n:
            break
        item = Item(r["text"], r["lang"])
        pred = checked_predict(classifier, [item])[0]
        req = model.request_for(item, pred)
        sent, reason = guarded(gen.generate([req])[0], req)
        if reason is not None:
            continue
        template = domain.answers.answer(pred.intent, r["lang"])
        written_is_a = side.random() < 0.5
        a, b = (sent, template) if written_is_a else (template, sent)
        out.append({"id": r["id"], "lang": r["lang"], "message": r["text"], "policy": template, "A": a, "B": b,
                    "key": "A" if written_is_a else "B"})
        print(f"{len(out)}/{n} {r['id']}", file=sys.stderr, flush=True)
    return out


def blind(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """What the judge sees: no `key`."""
    return [{k: v for k, v in r.items() if k != "key"} for r in rows]


def score(rows: Sequence[dict[str, str]], verdicts: dict[str, dict[str, str]], source: str = "") -> str:
    """The section: the tally (written better, template better, the same) and every pair, unblinded."""
    missing = [r["id"] for r in rows if verdicts.get(r["id"], {}).get("better") not in VERDICTS]
    if missing:
        raise SystemExit(f"side_by_side: no verdict (A, B or same) for {', '.join(missing)}")
    tally: Counter[str] = Counter()
    lines = ["| message | lang | customer | written reply | template | judged more helpful | why |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        v = verdicts[r["id"]]
        won = "same" if v["better"] == "same" else ("written" if v["better"] == r["key"] else "template")
        tally[won] += 1
        written, template = (r["A"], r["B"]) if r["key"] == "A" else (r["B"], r["A"])
        cells = [r["id"], r["lang"], r["message"], written, template, won, v.get("why", "")]
        lines.append("| " + " | ".join(" ".join(c.replace("|", "/").split()) for c in cells) + " |")
    n = len(rows)
    return "\n".join([
        f"{n} check-set messages whose written reply the guard sends (fixed random order, seed 1), each shown to a "
        "judge as the customer's message, the policy and two replies in a random order (seed 2), not saying which "
        "is written; the judge picked the more helpful reply to the customer, judged against the policy text, or "
        "called them the same. The judge: a separate model session given only the blind file. Blind to the labels, not "
        "to style: the template is the policy text word for word, which a judge can notice."
        + (f" Pairs and verdicts: {source}." if source else ""), "",
        f"Written reply more helpful: **{tally['written']}** of {n}; template more helpful: {tally['template']}; "
        f"the same: {tally['same']}.", "", *lines])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("pairs", help="write the pairs (with the key) and the blind file for the judge")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path("side_by_side.jsonl"))
    s = sub.add_parser("score", help="unblind the judge's verdicts")
    s.add_argument("--pairs", type=Path, required=True)
    s.add_argument("--verdicts", type=Path, required=True)
    s.add_argument("--write", action="store_true", help="write the section to BENCHMARKS.md")
    args = ap.parse_args(argv)
    if args.step == "pairs":
        rows = pairs(args.n)
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        judged = args.out.with_suffix(".blind.jsonl")
        judged.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in blind(rows)), encoding="utf-8")
        print(f"{len(rows)} pairs: {args.out} (with the key), {judged} (for the judge)")
        return 0
    rows = [json.loads(x) for x in args.pairs.read_text(encoding="utf-8").splitlines() if x.strip()]
    body = score(rows, json.loads(args.verdicts.read_text(encoding="utf-8")),
                 f"`{args.pairs}` (from `python -m bench.side_by_side pairs --n {len(rows)} --out {args.pairs}`), "
                 f"`{args.verdicts}`")
    print(body)
    if args.write:
        write_section(TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`tierflow learn` (the trainer agent) and `tierflow models` (the light model's versions, for operators)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

from pipeline.ops.commands import run_agent, settings_of


def cmd_learn(args: argparse.Namespace) -> int:
    from pipeline.agents.trainer import Trainer

    return run_agent(settings_of(args), Trainer)


def cmd_models(args: argparse.Namespace) -> int:
    from pipeline.adapters.model_store import PACKAGED, ModelStore
    from pipeline.adapters.redis_client import make_redis
    from pipeline.contracts.keys import Keys
    from pipeline.errors import ConfigError

    s = settings_of(args)
    r = make_redis(s, command=True)
    store = ModelStore.of(s, r)
    store.cache.ensure_restored()  # an empty Redis shows what the control topic kept, not nothing
    who = f"cli:{os.environ.get('USER', 'operator')}"
    if args.action == "list":
        live = store.live()
        print(f"live: {live}" + ("  (the domain pack's own model)" if live == PACKAGED else ""))
        rows = [store.manifest(v) for v in store.versions()]
        if rows:
            print(f"{'version':<34} {'status':<12} {'parent':<34} {'examples':>8}  agreement vs live")
        for m in rows:
            ev = m.get("evaluation", {}).get("agreement")
            agree = (f"{ev['candidate']:.1%} vs {ev['live']:.1%} [{ev['lo']:+.1%}, {ev['hi']:+.1%}] n={ev['n']}"
                     if ev and ev.get("n") else "-")
            mark = "*" if m["version"] == live else " "
            print(f"{mark}{m['version']:<33} {m.get('status', '-'):<12} {m.get('parent', '-'):<34} "
                  f"{m.get('data', {}).get('examples', 0):>8}  {agree}")
        raw = r.get(Keys(s.redis.prefix).learn_state)
        if raw is not None:
            state = json.loads(raw)
            age = time.time() - state["at_ms"] / 1000
            print(f"trainer ({age:.0f} s ago): {state['examples']} examples ({state['held_out']} held out), "
                  f"{state['new_since_training']} new since the last training, {state['trainings']} trainings"
                  + (", training now" if state["training_now"] else "") + f"; verdicts {state['verdicts']}")
        else:
            print("trainer: not running (TIERFLOW_LEARN_ENABLED=true for `tierflow up`, or `tierflow learn`)")
    elif args.action == "show":
        version = args.version or store.live()
        if version == PACKAGED:
            print(json.dumps({"version": PACKAGED, "about": "the domain pack's own light model"}, indent=2))
        else:
            print(json.dumps(store.manifest(version), indent=2, ensure_ascii=False))
        for e in store.history():
            if e["version"] == version:
                print(_event_line(e))
    elif args.action == "history":
        events = store.history(args.last)
        for e in events:
            print(_event_line(e))
        if not events:
            print("no model changes yet: the packaged light model has been live since the start")
    elif args.action == "promote":
        if not args.version:
            raise ConfigError("give the VERSION to promote (`tierflow models list` shows them)")
        store.manifest(args.version)  # a clear error for a version that does not exist
        e = store.set_live(args.version, "promote", who, args.reason or "operator's decision", {"forced": True})
        store.update_manifest(args.version, status="promoted")
        print(f"live: {args.version} (was {e['previous']}); light workers swap within seconds")
    elif args.action == "rollback":
        target = args.version or store.parent_of_live() or PACKAGED
        e = store.set_live(target, "rollback", who, args.reason or "operator's rollback")
        if e["previous"] != PACKAGED:
            store.update_manifest(e["previous"], status="rolled_back")
        print(f"live: {target} (was {e['previous']})")
    elif args.action == "submit":
        if args.file is None:
            raise ConfigError("give --file MODEL.npz (the charngram.npz of `tierflow train`)")
        version = submit(store, args.file, who, s)
        print(f"submitted {version}: the trainer judges it on the held-out examples (`tierflow models list`)")
    return 0


def submit(store: Any, path: Path, who: str, s: Any) -> str:
    """Store an externally trained char n-gram model as a candidate the trainer agent evaluates."""
    from pipeline.errors import ConfigError
    from workers.models.charngram import CharNgramClassifier
    from workers.models.common import domain_artifacts

    labels = domain_artifacts(s)[0].labels
    try:
        model = CharNgramClassifier.load(path, labels)
        if model.weight.shape[1] != len(labels):
            raise ValueError(f"{model.weight.shape[1]} classes, the pack has {len(labels)}")
        model.logits(["check"])  # loads and answers: not any npz
    except (OSError, KeyError, ValueError) as e:
        raise ConfigError(f"--file {path}: not a char n-gram model ({e}); expected the charngram.npz of "
                          "`tierflow train`") from None
    version = f"submitted-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{path.stem[:20]}"
    store.put(version, path.read_bytes(), {"version": version, "parent": store.live(), "status": "submitted",
                                           "labels": labels, "who": who, "data": {"file": str(path)},
                                           "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
    store.record("submit", version, who, f"submitted from {path}")
    return version


def _event_line(e: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
    return f"{when}  {e['action']:<8} {e['version']:<34} from {e['previous']:<34} by {e['who']:<16} {e['why']}"

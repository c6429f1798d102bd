"""The `tierflow` command: the argument parser and a dispatch table, nothing else. Every flag that has a setting
falls back to its TIERFLOW_* variable. The commands themselves are in `pipeline/ops/commands.py`."""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.errors import ConfigError, InvalidThresholds, ServiceUnavailable, TierflowError
from pipeline.ops.commands import BENCHES, fatal, interrupted, settings_of, setup_logging

Command = Callable[[argparse.Namespace], int]

# subcommand -> "module:function" that runs it (its exit code is the process's). A command's module is imported
# only when it runs: `tierflow send` does not load what `tierflow up` needs.
COMMANDS: dict[str, str] = {
    "up": "pipeline.ops.up:cmd_up",
    "demo": "pipeline.ops.commands:cmd_demo",
    "topics": "pipeline.ops.commands:cmd_topics",
    "ingest": "pipeline.ops.commands:cmd_ingest",
    "worker": "pipeline.ops.commands:cmd_worker",
    "feedback": "pipeline.ops.commands:cmd_feedback",
    "send": "pipeline.ops.commands:cmd_send",
    "answers": "pipeline.ops.commands:cmd_answers",
    "handovers": "pipeline.ops.commands:cmd_handovers",
    "thresholds": "pipeline.ops.commands:cmd_thresholds",
    "vip": "pipeline.ops.commands:cmd_vip",
    "conversation": "pipeline.ops.commands:cmd_conversation",
    "forget": "pipeline.ops.commands:cmd_forget",
    "route": "pipeline.ops.commands:cmd_route",
    "fault": "pipeline.ops.commands:cmd_fault",
    "replay": "pipeline.ops.commands:cmd_replay",
    "bench": "pipeline.ops.commands:cmd_bench",
    "status": "pipeline.ops.commands:cmd_status",
    "report": "pipeline.ops.commands:cmd_report",
    "train": "pipeline.ops.commands:cmd_train",
    "learn": "pipeline.ops.models:cmd_learn",
    "models": "pipeline.ops.models:cmd_models",
}


def command(name: str) -> Command:
    """The function that runs subcommand `name`, its module imported now."""
    module, _, function = COMMANDS[name].partition(":")
    run: Command = getattr(importlib.import_module(module), function)
    return run


def _env_help(text: str, env: str) -> str:
    return f"{text} [env: {env}]"


# --------------------------------------------------------------------------- parser
class _Version(argparse.Action):
    """--version, resolved only when asked (git is not run for every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from pipeline.version import describe

        print(describe())  # to stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tierflow",
        description="Hybrid inference on Kafka: route each customer message to the cheapest model tier "
                    "that is good enough.",
    )
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and the source commit, exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_)

    def ports(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--kafka-port", type=int, help=_env_help("embedded broker port (19092)",
                                                                 "TIERFLOW_KAFKA_PORT"))
        sp.add_argument("--redis-port", type=int, help=_env_help("embedded Redis port (16379)",
                                                                 "TIERFLOW_REDIS_PORT"))

    def metrics_port(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--metrics-port", type=int, help=_env_help("serve Prometheus /metrics on this port",
                                                                   "TIERFLOW_METRICS_PORT"))

    sp = add("up", "Start the pipeline: embedded broker and Redis (unless TIERFLOW_KAFKA_BOOTSTRAP / "
                   "TIERFLOW_REDIS_URL are set), topics, ingest, one worker per tier, feedback.")
    ports(sp)
    sp.add_argument("--metrics-port", type=int, metavar="BASE",
                    help=_env_help("serve Prometheus /metrics: ingest on BASE, then each worker and the feedback "
                                   "agent on the next ports", "TIERFLOW_METRICS_PORT"))
    sp.add_argument("--data", type=Path, metavar="DIR",
                    help="keep the embedded broker's log in DIR across restarts (default: each start is empty)")
    sp = add("demo", "Start the embedded pipeline, send sample messages (English and Chinese), "
                     "print their answers and a routing summary, stop.")
    ports(sp)
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for all answers (600)")

    sp = add("topics", "Create (or list) the pipeline's topics.")
    sp.add_argument("action", choices=["create", "list"])

    sp = add("ingest", "Run the ingest agent: validate, tag, route requests to tier topics.")
    metrics_port(sp)
    sp = add("worker", "Run a tier's worker(s): micro-batch, infer, publish results and answers.")
    sp.add_argument("--tier", required=True, choices=["light", "heavy", "multimodal"])
    sp.add_argument("--device", help=_env_help("cpu, cuda, cuda:N or auto", "TIERFLOW_<TIER>_DEVICE"))
    sp.add_argument("--concurrency", type=int, default=1, help="worker processes in this pool (1)")
    metrics_port(sp)
    sp = add("feedback", "Run the feedback agent: windowed stats per tier, threshold control.")
    metrics_port(sp)

    sp = add("send", "Publish one customer message to the requests topic.")
    sp.add_argument("text", nargs="?", help="the message text")
    sp.add_argument("--user", help="user id (VIPs go to the heavy tier)")
    sp.add_argument("--image", help="path of a PNG/JPEG/WebP image to attach")
    sp.add_argument("--lang", help="language hint, e.g. zh or en")
    sp.add_argument("--label", help="ground-truth intent, for evaluation")
    sp.add_argument("--id", help="request id (default: random)")
    sp.add_argument("--conversation", help="conversation id (default: the user's messages with no gap over "
                                           "TIERFLOW_CONVERSATION_IDLE_S are one conversation)")
    sp.add_argument("--wait", action="store_true", help="wait for the answer and print it")
    sp.add_argument("--timeout", type=float, default=60.0, help="with --wait: seconds to wait for the answer (60)")
    sp.add_argument("--ack-timeout", type=float, default=10.0,
                    help="seconds the broker may take to acknowledge the request (10); exit 2 when it does not")

    for name, what, about in (("answers", "answers", "the answers on the answers topic"),
                              ("handovers", "hand-overs", "the requests handed over to a person (tierflow.handover: "
                                                          "what a human agents' desk reads)")):
        sp = add(name, f"Print {about}, each request id once, and exit; --follow keeps printing new ones.")
        sp.add_argument("--follow", "-f", action="store_true", help=f"keep printing new {what} until Ctrl-C")
        sp.add_argument("--json", action="store_true", help="one JSON record per line")
        sp.add_argument("--new", action="store_true", help=f"only {what} that arrive from now on")
        sp.add_argument("--idle", type=float, default=0.0,
                        help="without --follow: once every existing one is printed, wait this many seconds more (0)")

    sp = add("thresholds", "Show, change, pin, list or roll back the routing thresholds.")
    tsub = sp.add_subparsers(dest="action", required=True)
    tsub.add_parser("show", help="print the current document")
    ts = tsub.add_parser("set", help="set KEY to VALUE (bounds-checked) as a new version")
    ts.add_argument("key")
    ts.add_argument("value")
    ts.add_argument("--reason", help="why (kept in the history)")
    tp = tsub.add_parser("pin", help="pin keys so the feedback controller leaves them alone")
    tp.add_argument("keys", nargs="+")
    tu = tsub.add_parser("unpin", help="let the feedback controller move keys again")
    tu.add_argument("keys", nargs="+")
    th = tsub.add_parser("history", help="every version with who and why")
    th.add_argument("--last", type=int, help="only the last N versions")
    tr = tsub.add_parser("rollback", help="restore the values of VERSION as a new version")
    tr.add_argument("version", type=int)

    sp = add("vip", "Manage VIP users (their messages go to the heavy tier).")
    sp.add_argument("action", choices=["add", "remove", "list"])
    sp.add_argument("users", nargs="*")

    sp = add("conversation", "Show a customer's conversation as tierflow keeps it: their last turns and answers.")
    sp.add_argument("user")
    sp.add_argument("--replay-job", help="a replay job's copy of the conversation instead of the live one")
    sp.add_argument("--json", action="store_true", help="one JSON turn per line")

    sp = add("forget", "Erase customers' conversations everywhere tierflow keeps them (live and every replay "
                       "job's), refuse their messages in flight, and check that nothing is left.")
    sp.add_argument("users", nargs="+")

    sp = add("route", "Explain the routing of a message: features, rule, tier (no Kafka).")
    sp.add_argument("text")
    sp.add_argument("--user")
    sp.add_argument("--lang")
    sp.add_argument("--vip", action="store_true", help="treat the user as VIP")
    sp.add_argument("--image", action="store_true", help="as if an image were attached")

    sp = add("fault", "Chaos testing: inject latency into a tier's workers.")
    sp.add_argument("action", choices=["latency"])
    sp.add_argument("--tier", required=True, choices=["light", "heavy", "multimodal"])
    sp.add_argument("--ms", type=float, required=True, help="extra milliseconds per batch (0 clears)")
    sp.add_argument("--seconds", type=float, help="clear by itself after this many seconds")

    sp = add("replay", "Replay recorded requests from a topic range or a JSONL/Parquet file through "
                       "the backfill path (never ahead of live traffic). Resumable and idempotent.")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="JSONL (or .parquet) of request.v1 objects")
    src.add_argument("--topic", help="a topic to read, e.g. tierflow.requests")
    sp.add_argument("--from", dest="start", help="start time (epoch ms or ISO-8601) in --topic")
    sp.add_argument("--to", dest="end", help="end time (inclusive)")
    sp.add_argument("--from-offsets", dest="start_offsets", help="start offsets, e.g. 0:120,1:95")
    sp.add_argument("--to-offsets", dest="end_offsets", help="end offsets (exclusive)")
    sp.add_argument("--rate", type=float, help="at most this many messages per second")
    sp.add_argument("--max-live-slowdown", type=float, default=1.15,
                    help="back off while live p95 is over this multiple of its value before the replay "
                         "(1.15; 0 turns the guard off)")
    sp.add_argument("--limit", type=int, help="at most N records")
    sp.add_argument("--pin-thresholds", type=int, metavar="VERSION", help="route under this threshold version")
    sp.add_argument("--shadow", action="store_true", help="run light and heavy on every record, answer nobody")
    sp.add_argument("--force", action="store_true", help="answer ids a replay already answered")
    sp.add_argument("--job", help="job name (default: derived from the source and range; reruns resume it)")
    sp.add_argument("--restart", action="store_true", help="ignore saved progress and start over")
    sp.add_argument("--wait", type=float, metavar="SECONDS", help="wait for results and print accuracy per tier")

    sp = add("bench", "Run the benchmarks (bench/) and write BENCHMARKS.md sections with plots.")
    sp.add_argument("--quick", action="store_true", help="reduced sizes: minutes on 2 cores")
    sp.add_argument("--only", help=f"comma list of: {', '.join(BENCHES)}")
    sp.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")

    sp = add("status", "Live terminal view: per-tier throughput, p95, lag, heavy share, thresholds, DLQ.")
    sp.add_argument("--once", action="store_true", help="print one frame and exit")
    sp.add_argument("--interval", type=float, default=1.0, help="seconds between frames (1)")
    sp = add("report", "Write a PNG and a text summary of a run: latency per tier, traffic split, "
                       "accuracy vs heavy share.")
    sp.add_argument("--out", type=Path, default=Path("report"), help="output directory (./report)")
    sp.add_argument("--minutes", type=float, help="only the last N minutes of results (default: all)")

    sp = add("train", "Train the light, heavy and multilingual heads for a domain pack or on a text,category CSV.")
    sp.add_argument("--domain", help="a domain pack ('ecommerce', 'banking' or a pack's directory): its training "
                                     "data, test set, Chinese lines and answers, unless --data/--test say otherwise")
    sp.add_argument("--data", type=Path, help="training CSV with columns text,category (default: the pack's)")
    sp.add_argument("--test", type=Path, help="test CSV (default: the pack's, else a held-out split of --data)")
    # The training command's own flags (workers/training/run.py build_parser; a test keeps the two equal). No
    # default for --out: unset, training picks TIERFLOW_ARTIFACTS_DIR or ./artifacts and says how to serve it.
    sp.add_argument("--out", type=Path, help="artefact root; a new version directory goes under it "
                                             "[env: TIERFLOW_ARTIFACTS_DIR] (default ./artifacts)")
    sp.add_argument("--models", help="comma list of: charngram, minilm, e5 (default: all)")
    sp.add_argument("--seed", type=int, help="sampling and initialisation seed (0)")
    sp.add_argument("--epochs", type=int, help="MiniLM fine-tuning epochs")

    metrics_port(add("learn", "Run the trainer agent: the light model learns from heavy's answers and labels; a "
                              "new version goes live only when it beats the live one on held-out traffic."))
    sp = add("models", "The light model's versions: list, show, history, promote, rollback, submit a candidate.")
    sp.add_argument("action", choices=["list", "show", "history", "promote", "rollback", "submit"])
    sp.add_argument("version", nargs="?", help="show/promote/rollback: the version (rollback: default the parent)")
    sp.add_argument("--reason", help="why, for the history (promote, rollback)")
    sp.add_argument("--file", type=Path, help="submit: a charngram.npz to be judged like the trainer's own")
    sp.add_argument("--last", type=int, help="history: only the last N events")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # before the settings are imported: `--help` and a wrong flag answer at once
    from pipeline.settings import unknown_env

    for warning in unknown_env():
        print(f"tierflow: warning: {warning}", file=sys.stderr)
    json_logs = False
    try:
        settings = settings_of(args)  # a wrong TIERFLOW_* variable raises ConfigError here, one line each
        gc.freeze()  # what is loaded by now lives as long as the process: full collections need not walk it again
        setup_logging(settings)
        json_logs = settings.log_json
        code: int = command(args.command)(args)
        # Stopped by Ctrl-C: the shell's convention (128 + SIGINT), also when the command wound down cleanly
        return 130 if code == 0 and interrupted() else code
    except (ServiceUnavailable, ConfigError, InvalidThresholds) as e:
        fatal(args.command, str(e).splitlines() or [""], json_logs)
        return 2
    except TierflowError as e:
        fatal(args.command, [f"{e.__class__.__name__}: {e}"], json_logs)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

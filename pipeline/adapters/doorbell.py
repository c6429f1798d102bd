"""Doorbells: whoever writes a topic rings it (Redis pub/sub) and the topic's resting consumers wake at once.

On a broker that answers empty fetches at once, an idle consumer rests and looks at the log's end at intervals of
up to `TIERFLOW_KAFKA_REST_MAX_MS` (pipeline/core/fetch_pacing.py): a lone record would wait up to that at every
hop. tierflow's own writers ring: `tierflow send` rings the requests topic, ingest the tier topics it routed to, a
light worker the heavy topic it escalated to. A ring is a hint: lost (Redis down, a consumer subscribing late),
the record is found at the next look, as for any other writer's records.

redis-py is imported only where a client is used: a one-shot command rings with `ring_once`, which speaks the
two commands it needs itself rather than load redis-py (and the asyncio client redis-py imports with it).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from pipeline.adapters.redis_client import COMMAND_TIMEOUTS_S, make_redis
from pipeline.contracts.keys import Keys
from pipeline.settings import Settings

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)


def ring(r: redis.Redis, prefix: str, topics: Iterable[str]) -> None:
    """Say that records were written to `topics` (one round trip for all): publish on each one's doorbell and count
    the ring (`Keys.rung`: a busy consumer reads it); never raises. (`ring_once`, for the requests topic, only
    publishes.)"""
    import redis

    keys = Keys(prefix)
    try:
        pipe = r.pipeline(transaction=False)
        for t in topics:
            pipe.publish(keys.wake(t), b"")
            pipe.incr(keys.rung(t))
        pipe.execute()
    except (redis.RedisError, OSError) as e:
        log.debug("doorbell: %s", e)


def ring_once(settings: Settings, topics: Iterable[str]) -> None:
    """`ring` for a process that rings once and exits (`tierflow send`): the PUBLISHes go over a plain socket, so
    the command does not import redis-py (~0.1 s, most of what the ring would cost it). A URL this does not speak
    (TLS, a Unix socket, a user name, options in the query) is rung through redis-py. Never raises."""
    topics = list(topics)
    try:
        u = urlsplit(settings.redis.address)
        host, port = u.hostname, u.port or 6379
    except ValueError:  # a port that is no number: redis-py says what is wrong with the URL
        host = None
    if host is None or u.scheme != "redis" or u.query or u.username:
        ring(make_redis(settings, command=True), settings.redis.prefix, topics)
        return
    # What redis-py sends for such a URL: AUTH with the password if there is one, then the PUBLISHes (pub/sub is
    # the same in every database: the URL's database needs no SELECT).
    commands = [[b"AUTH", unquote(u.password).encode()]] if u.password else []
    keys = Keys(settings.redis.prefix)
    commands += [[b"PUBLISH", keys.wake(t).encode(), b""] for t in topics]
    reply_s, connect_s = COMMAND_TIMEOUTS_S
    try:
        with socket.create_connection((host, port), timeout=connect_s) as sock:
            sock.settimeout(reply_s)
            sock.sendall(b"".join(resp_command(c) for c in commands))
            errors = [line for line in _reply_lines(sock, len(commands)) if line.startswith(b"-")]
        if errors:  # e.g. a wrong password: the consumers find the records at their next look
            log.debug("doorbell: %s", errors[0][1:].decode(errors="replace"))
    except OSError as e:
        log.debug("doorbell: %s", e)


def resp_command(args: list[bytes]) -> bytes:
    """One command in the Redis protocol (RESP): an array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _reply_lines(sock: socket.socket, n: int) -> list[bytes]:
    """The first `n` replies, each one line (`:1`, `+OK`, `-ERR ...`: what AUTH and PUBLISH answer)."""
    buf = b""
    while buf.count(b"\r\n") < n:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("Redis closed the connection")
        buf += chunk
    return buf.split(b"\r\n")[:n]


class Bell:
    """Listens to the doorbells of `topics` in a thread of its own; `event` is set when one rings."""

    def __init__(self, settings: Settings, topics: Iterable[str]) -> None:
        self.settings = settings
        self.channels = [Keys(settings.redis.prefix).wake(t) for t in topics]
        self.event = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="doorbell", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import redis

        while not self._stopping.is_set():
            pubsub = None
            try:
                pubsub = make_redis(self.settings).pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(*self.channels)
                while not self._stopping.is_set():
                    if pubsub.get_message(timeout=1.0) is not None:
                        self.event.set()
            except (redis.RedisError, OSError) as e:  # Redis down: the consumer still looks at its pace
                log.debug("doorbell: %s", e)
                self._stopping.wait(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(redis.RedisError, OSError):
                        pubsub.close()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2.0)

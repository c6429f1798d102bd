"""The conversation store: each customer's last turns in Redis, one bounded list per customer (`Keys.conversation`).

Why Redis and not a changelog topic: a conversation lives for minutes (the idle timeout is its TTL), every stage
already reaches Redis, a customer's turns are read by ingest and completed by whichever tier answers (not by one
partition's owner, so a rebalance moves nothing), and `tierflow forget` must leave nothing to read: a DEL does that
at once, where a tombstone on a topic leaves the turns in the log until compaction runs (and the embedded brokers
do not compact). Under `tierflow up --data` Valkey's append-only file keeps the turns across restarts.

Writes are upserts by request id (a re-read batch writes the same turn again, not a second one), bounded to
`max_turns` per customer, and refused for turns older than the customer's last `forget` (a message in flight
while its customer was forgotten does not bring them back).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import redis

from pipeline import metrics
from pipeline.contracts.keys import Keys
from pipeline.contracts.records import Context, Turn
from pipeline.core import conversation as conv
from pipeline.settings import ConversationSection

log = logging.getLogger(__name__)

# KEYS: the turns, the forget mark. ARGV: the turn's JSON prefix up to its id, the turn, its time, max turns, TTL ms.
# Replaces the turn with the same id, else appends it; a turn older than the customer's forget mark is dropped.
UPSERT = """
local f = redis.call('GET', KEYS[2])
if f and tonumber(f) >= tonumber(ARGV[3]) then return 0 end
local p = ARGV[1]
local turns = redis.call('LRANGE', KEYS[1], 0, -1)
for i = #turns, 1, -1 do
  if string.sub(turns[i], 1, #p) == p then
    redis.call('LSET', KEYS[1], i - 1, ARGV[2])
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    return 1
  end
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[4]), -1)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 2
"""


def dump_turn(t: Turn) -> bytes:
    """A turn's JSON, its id first (the upsert finds a turn by that prefix)."""
    return orjson.dumps({"id": t["id"], **{k: v for k, v in t.items() if k != "id"}})


def id_prefix(request_id: str) -> bytes:
    return b'{"id":' + orjson.dumps(request_id) + b","


def turn_of(raw: bytes | str) -> Turn | None:
    """The one reader of a stored turn; None for bytes that are not one (a turn is read, never trusted to crash)."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not isinstance(d.get("at"), int):
        return None
    d.setdefault("conversation_id", "")
    d.setdefault("text", "")
    d.setdefault("lang", "en")
    if not isinstance(d.get("slots"), dict):
        d["slots"] = {}
    for flag in ("follow_up", "complaint", "unresolved"):
        d[flag] = bool(d.get(flag, False))
    return d  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Message:
    """What the store needs of a message to place it in its customer's conversation."""

    user_id: str
    request_id: str
    at_ms: int
    text: str
    lang: str
    complaint: bool
    conversation_id: str | None = None  # the client's, if it sent one
    replay_job: str | None = None  # a backfill's: its conversations are kept apart from the live ones


@dataclass(frozen=True, slots=True)
class Pending:
    """New turns placed and not yet written: (key, turn) each, with each turn's customer."""

    writes: Sequence[tuple[str, Turn]] = ()
    users: Sequence[str] = ()


@dataclass
class Conversations:
    """Reads and writes customers' turns. `contexts()` places a batch of messages in their conversations (one round
    trip to read, one to write); `complete()` records an answer in its turn (one round trip per batch)."""

    r: redis.Redis
    keys: Keys
    cfg: ConversationSection
    component: str
    _upsert: object = field(init=False)
    _warned_at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._upsert = self.r.register_script(UPSERT)

    def contexts(self, msgs: Sequence[Message], now_ms: int) -> list[Context | None]:
        """Each message's context, in order (a customer's earlier messages of the same batch count), with each
        message written as a new turn. None per message when Redis is away: it is answered on its own."""
        out, pending = self.place(msgs, now_ms)
        self.save(pending)
        return out

    def place(self, msgs: Sequence[Message], now_ms: int) -> tuple[list[Context | None], Pending]:
        """`contexts()` in two halves: the contexts (one round trip) and the new turns still to `save()`, which a
        caller does once the messages are on their way (their routing does not wait on the write). The next
        message of a customer must be placed after the save: ingest saves before it reads its next batch."""
        if not msgs:
            return [], Pending()
        keys = [self.keys.conversation(m.user_id, m.replay_job) for m in msgs]
        distinct = list(dict.fromkeys(keys))
        try:
            pipe = self.r.pipeline(transaction=False)
            for k in distinct:
                pipe.lrange(k, 0, -1)
            stored = dict(zip(distinct, pipe.execute(), strict=True))
        except (redis.RedisError, OSError) as e:
            self._unavailable(e)
            return [None] * len(msgs), Pending()
        turns: dict[str, list[Turn]] = {k: [t for raw in v if (t := turn_of(raw)) is not None]
                                        for k, v in stored.items()}
        out: list[Context | None] = []
        writes: list[tuple[str, Turn]] = []
        for m, k in zip(msgs, keys, strict=True):
            past = conv.live_turns(turns[k], now_ms, self.cfg.idle_ms, m.conversation_id)
            cid = conv.conversation_id_of(m.conversation_id, past, m.user_id, m.request_id)
            past = [t for t in past if t["id"] != m.request_id]  # a re-read message is not its own history
            turn = conv.new_turn(m.request_id, cid, m.at_ms, m.text, m.lang, m.complaint)
            out.append(conv.context_of(past[-self.cfg.max_turns:], turn))
            turns[k] = [*past, turn]
            writes.append((k, turn))
        return out, Pending(writes, [m.user_id for m in msgs])

    def save(self, pending: Pending) -> None:
        """Write the turns `place()` made (one round trip)."""
        self._write(pending.writes, pending.users)

    def complete(self, done: Sequence[tuple[str, str | None, Turn]]) -> None:
        """Record answered turns: (user id, replay job, the turn with its outcome) each."""
        self._write([(self.keys.conversation(u, job), t) for u, job, t in done], [u for u, _, _ in done])

    def _write(self, writes: Sequence[tuple[str, Turn]], users: Sequence[str]) -> None:
        if not writes:
            return
        ttl = self.cfg.idle_ms
        try:
            pipe = self.r.pipeline(transaction=False)
            for (k, t), user in zip(writes, users, strict=True):
                self._upsert(keys=[k, self.keys.forgotten(user)],  # type: ignore[operator]
                             args=[id_prefix(t["id"]), dump_turn(t), t["at"], self.cfg.max_turns, ttl], client=pipe)
            pipe.execute()
        except (redis.RedisError, OSError) as e:
            self._unavailable(e)

    def _unavailable(self, e: Exception) -> None:
        metrics.REDIS_ERRORS.labels(self.component).inc()
        now = time.monotonic()
        if now - self._warned_at > 60:  # once a minute: an outage is one line, not one per batch
            self._warned_at = now
            log.warning("%s: conversations unavailable (%s): messages are answered without their context",
                        self.component, e)

    # --- what `tierflow forget` and `tierflow conversation` do
    def forget(self, user_id: str) -> int:
        """Erase a customer's turns everywhere they are kept (live and every replay job's) and refuse turns of
        messages received before now (in flight while this runs). Returns how many keys were deleted."""
        now_ms = int(time.time() * 1000)
        # The mark outlives any turn it refuses: a message in flight is at most one idle timeout old.
        self.r.set(self.keys.forgotten(user_id), now_ms, px=self.cfg.idle_ms * 2)
        found = [self.keys.conversation(user_id), *self.r.scan_iter(self.keys.conversations_of(user_id), count=1000)]
        return int(self.r.delete(*found)) if found else 0

    def held(self, user_id: str) -> list[str]:
        """The keys that still hold turns of `user_id` (empty after `forget`)."""
        keys = [self.keys.conversation(user_id), *self.r.scan_iter(self.keys.conversations_of(user_id), count=1000)]
        return [k.decode() if isinstance(k, bytes) else str(k) for k in keys if self.r.exists(k)]

    def turns(self, user_id: str, replay_job: str | None = None) -> list[Turn]:
        """A customer's stored turns, oldest first (what `tierflow conversation USER` shows)."""
        raw = self.r.lrange(self.keys.conversation(user_id, replay_job), 0, -1)
        return sorted((t for b in raw if (t := turn_of(b)) is not None), key=lambda t: t["at"])


def messages_bytes(turns: Sequence[Turn]) -> int:
    """What a customer's turns take as stored (their JSON), for the bound's report."""
    return sum(len(dump_turn(t)) for t in turns)

"""Every Redis key and channel tierflow uses, in one place (as `topics.py` is for topics).

All live under the settings' `redis_prefix` (default `tierflow:`), so two stacks can share one Redis:
- `thresholds`, `thresholds:history`, `thresholds:changed`  the routing document, its versions, its pub/sub
- `vip`, `vip:changed`                                   the VIP user set and its pub/sub
- `hb:<tier>:<worker>`                                    a worker's (or agent's) heartbeat, with a TTL
- `fault:latency_ms:<tier>`                               injected latency (`tierflow fault latency`)
- `feedback:state`                                        the feedback agent's snapshot
- `replay:answered`, `replay:job:<job>`                   ids a replay answered; a replay job's progress
- `tx:<stable id>`                                        a worker's transactional id of its last run
- `models:light:live`, `models:light:changed`             the light model version serving, its pub/sub
- `models:light:v:<version>`, `models:light:versions`      a version's weights and manifest; every version kept
- `models:light:history`                                  every promotion, rejection and rollback, oldest first
- `learn:state`                                           the trainer agent's snapshot (`tierflow models list`)
- `wake:<topic>`                                          pub/sub: records were written to <topic> (a doorbell)
- `conv:<user>`, `conv:replay:<job>:<user>`              a customer's conversation turns (live; a replay job's own),
                                                          each expiring after the conversation's idle timeout
- `conv:forgot:<user>`                                    when `tierflow forget` erased a customer (older turns refused)
- `epoch`                                                 set once this Redis holds the control state (restored
                                                          from the control topic, or seeded): absent = empty Redis

The control topic's record keys (`ControlKeys`) are here too: they name the same facts in the durable home.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "tierflow:"

    @property
    def thresholds(self) -> str:
        return f"{self.prefix}thresholds"

    @property
    def thresholds_history(self) -> str:
        return f"{self.prefix}thresholds:history"

    @property
    def thresholds_changed(self) -> str:
        return f"{self.prefix}thresholds:changed"

    @property
    def vip(self) -> str:
        return f"{self.prefix}vip"

    @property
    def vip_changed(self) -> str:
        return f"{self.prefix}vip:changed"

    def heartbeat(self, tier: str, worker_id: str) -> str:
        return f"{self.prefix}hb:{tier}:{worker_id}"

    def heartbeats(self, tier: str) -> str:
        """The SCAN pattern of one tier's heartbeats."""
        return f"{self.prefix}hb:{tier}:*"

    def fault_latency(self, tier: str) -> str:
        return f"{self.prefix}fault:latency_ms:{tier}"

    @property
    def feedback_state(self) -> str:
        return f"{self.prefix}feedback:state"

    @property
    def replay_answered(self) -> str:
        return f"{self.prefix}replay:answered"

    def replay_job(self, job: str) -> str:
        return f"{self.prefix}replay:job:{job}"

    def transactional_id(self, stable: str) -> str:
        return f"{self.prefix}tx:{stable}"

    @property
    def model_live(self) -> str:
        return f"{self.prefix}models:light:live"

    @property
    def model_changed(self) -> str:
        return f"{self.prefix}models:light:changed"

    def model_version(self, version: str) -> str:
        return f"{self.prefix}models:light:v:{version}"

    @property
    def model_versions(self) -> str:
        return f"{self.prefix}models:light:versions"

    @property
    def model_history(self) -> str:
        return f"{self.prefix}models:light:history"

    @property
    def epoch(self) -> str:
        return f"{self.prefix}epoch"

    @property
    def learn_state(self) -> str:
        return f"{self.prefix}learn:state"

    def conversation(self, user_id: str, replay_job: str | None = None) -> str:
        """A customer's turns: live, or a replay job's (a backfill rebuilds its conversations apart from live ones)."""
        if replay_job is None:
            return f"{self.prefix}conv:{user_id}"
        return f"{self.prefix}conv:replay:{replay_job}:{user_id}"

    def conversations_of(self, user_id: str) -> str:
        """The SCAN pattern of every replay job's turns of one customer (glob characters in the id escaped)."""
        escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in user_id)
        return f"{self.prefix}conv:replay:*:{escaped}"

    def forgotten(self, user_id: str) -> str:
        return f"{self.prefix}conv:forgot:{user_id}"

    def wake(self, topic: str) -> str:
        """The doorbell of `topic`: its writers publish here, its resting consumers wake (adapters/doorbell.py)."""
        return f"{self.prefix}wake:{topic}"

    def rung(self, topic: str) -> str:
        """How many times `topic`'s doorbell has rung (a counter): a busy consumer can tell that records arrived
        behind the batch in hand (the heavy tier's writer yields to them)."""
        return f"{self.prefix}rung:{topic}"


class ControlKeys:
    """Record keys on the control topic (`Topics.control`), one per fact so compaction keeps each one's latest:
    `thresholds:<version>` (that version's document), `vip:<user>` (present; a tombstone removes it),
    `replay:job:<job>` (a replay job's progress), `replay:answered:<request id>` (a replay answered it), and the
    learned light model's `models:light:v:<version>` (its manifest) and `models:light:w:<version>` (its weights,
    written once: a manifest changes more often), both tombstoned once pruned,
    `models:light:live` (the pointer) and `models:light:event:<n>` (its history, one record per event)."""

    THRESHOLDS = "thresholds"
    VIP = "vip"
    REPLAY_JOB = "replay:job"
    REPLAY_ANSWERED = "replay:answered"

    MODEL_VERSION = "models:light:v"
    MODEL_WEIGHTS = "models:light:w"
    MODEL_LIVE = "models:light:live"
    MODEL_EVENT = "models:light:event"

    @staticmethod
    def model_version(version: str) -> str:
        return f"{ControlKeys.MODEL_VERSION}:{version}"

    @staticmethod
    def model_weights(version: str) -> str:
        return f"{ControlKeys.MODEL_WEIGHTS}:{version}"

    @staticmethod
    def model_event(at: float, action: str, version: str) -> str:
        """Unique per event (time in ms, what, which version): the history is every such record, in time order."""
        return f"{ControlKeys.MODEL_EVENT}:{int(at * 1000):013d}:{action}:{version}"

    @staticmethod
    def replay_job(job: str) -> str:
        return f"{ControlKeys.REPLAY_JOB}:{job}"

    @staticmethod
    def replay_answered(request_id: str) -> str:
        return f"{ControlKeys.REPLAY_ANSWERED}:{request_id}"

    @staticmethod
    def thresholds(version: int) -> str:
        return f"{ControlKeys.THRESHOLDS}:{version}"

    @staticmethod
    def vip(user: str) -> str:
        return f"{ControlKeys.VIP}:{user}"

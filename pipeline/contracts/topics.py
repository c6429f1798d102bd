"""Topic names and the Tier enum: the only place topic strings live."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Tier(StrEnum):
    """A model tier: where a request is answered."""

    LIGHT = "light"
    HEAVY = "heavy"
    MULTIMODAL = "multimodal"


@dataclass(frozen=True, slots=True)
class Topics:
    """Every topic of the pipeline, under one prefix (`TIERFLOW_TOPIC_PREFIX`)."""

    prefix: str = "tierflow."

    @property
    def requests(self) -> str:
        return f"{self.prefix}requests"

    @property
    def results(self) -> str:
        return f"{self.prefix}results"

    @property
    def answers(self) -> str:
        return f"{self.prefix}answers"

    @property
    def answer_drafts(self) -> str:
        """Written answers as the heavy tier's writer writes them (schemas/answer_draft.v1.json), a sentence at a
        time, for a chat widget to show at once; the one final answer is on `answers`."""
        return f"{self.prefix}answers.drafts"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}dlq"

    @property
    def labels(self) -> str:
        return f"{self.prefix}labels"

    @property
    def handover(self) -> str:
        """Requests handed over to a person (schemas/handover.v1.json): a human agents' desk reads it."""
        return f"{self.prefix}handover"

    @property
    def control(self) -> str:
        """The durable home of control state (threshold versions, VIPs), compacted, one partition: Redis is
        its cache and is restored from it (pipeline/adapters/control_log.py)."""
        return f"{self.prefix}control"

    @property
    def replay(self) -> str:
        """Backfill requests: ingested beside live traffic but never ahead of it."""
        return f"{self.prefix}replay"

    def tier(self, tier: Tier | str) -> str:
        return f"{self.prefix}tier.{Tier(tier).value}"

    def replay_tier(self, tier: Tier | str) -> str:
        """A tier's backfill topic: workers read it only with capacity live traffic leaves free."""
        return f"{self.prefix}replay.tier.{Tier(tier).value}"

    def all(self) -> list[str]:
        """Every topic `tierflow topics create` makes, in a stable order."""
        return [
            self.requests,
            *(self.tier(t) for t in Tier),
            self.results,
            self.answers,
            self.dlq,
            self.labels,
            self.handover,
            self.answer_drafts,
            self.replay,
            *(self.replay_tier(t) for t in Tier),
            self.control,
        ]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What `tierflow topics create` creates: name, partitions, replication and topic configs."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]


_DAY_MS = 24 * 3600 * 1000


def topic_specs(
    topics: Topics, partitions: int, replication_factor: int = 1, max_message_bytes: int = 8 * 1024 * 1024,
    retention_ms: int | None = None, retention_bytes: int | None = None,
) -> list[TopicSpec]:
    """Specs of every pipeline topic. Records may carry inline images, hence `max.message.bytes`.

    `retention_ms` / `retention_bytes` (per partition) bound every topic alike when given (the embedded broker).
    A broker deletes whole segments only, so with a bound the segments are made a fraction of it: otherwise the
    default 1 GB segment holds everything and the bound never acts (measured on noida: 2.5 GB kept).
    """
    big = {"max.message.bytes": str(max_message_bytes)}
    retention = {
        topics.dlq: 30 * _DAY_MS,  # operators need time to inspect dead letters
        topics.labels: 30 * _DAY_MS,
        topics.handover: 30 * _DAY_MS,  # a desk that was closed for the weekend still finds Friday's
        topics.answer_drafts: 3600 * 1000,  # a draft matters while its answer is being written
    }
    specs = []
    for name in topics.all():
        if name == topics.control:
            # one fact per key, kept until replaced: compaction, not time, bounds it; one partition, one order
            cfg = {"cleanup.policy": "compact", "max.message.bytes": str(max_message_bytes)}
            if retention_bytes is not None:  # a broker that bounds every partition (noida) bounds this one too
                cfg["segment.bytes"] = str(max(64 * 1024, retention_bytes // 8))
            if replication_factor > 1:
                cfg["min.insync.replicas"] = str(min(2, replication_factor))
            specs.append(TopicSpec(name, 1, replication_factor, cfg))
            continue
        cfg = dict(big)
        cfg["retention.ms"] = str(retention_ms or retention.get(name, 7 * _DAY_MS))
        if retention_ms is not None:
            cfg["segment.ms"] = str(max(1000, retention_ms // 10))
        if retention_bytes is not None:
            cfg["retention.bytes"] = str(retention_bytes)
            cfg["segment.bytes"] = str(max(64 * 1024, retention_bytes // 8))
        if replication_factor > 1:
            cfg["min.insync.replicas"] = str(min(2, replication_factor))
        specs.append(TopicSpec(name, partitions, replication_factor, cfg))
    return specs

"""Ingest's per-message work as plain functions, for the peers' pipelines: the same calls as the agent's hot loop.

`Router.route(raw, key, timestamp_ms)` does what `pipeline.agents.ingest.Ingest._route_live` does for one record:
`records.fast_request` (orjson parse + the plain-request schema checks), `features.extract_fields` (length,
tokens, script/CJK, language, VIP, question/complaint/urgent cues), `routing.route` (image -> multimodal,
VIP -> heavy, longer than `length_threshold` -> heavy, else light), and the routed envelope written by
`records.RoutedBatch` (the request's own bytes spliced into `{"request": ..., "features": ..., ...}`). It returns the
tier topic, key and value to produce. A request the fast path does not accept takes the agent's slow path:
`models.decode_request` (pydantic, the full schema), `features.extract`, `records.routed_fields` and
`records.dump_routed`; an invalid one goes to the DLQ topic with its original bytes (without the agent's x-error
headers). Not done here, as in the benchmark's agent: shadow sampling (rate 0), heavy-tier health (healthy),
image magic-byte checks (the benchmark sends no images), metrics.

Imports only tierflow's pure layers (core, contracts) and orjson: the Quix peer runs it in a virtualenv of its own
(bench/peers/requirements-quix.txt) that has no redis, faust or prometheus_client.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.contracts.models import decode_request
from pipeline.contracts.records import RoutedBatch, dump_routed, fast_request, routed_fields
from pipeline.contracts.topics import Tier
from pipeline.core import features
from pipeline.core.routing import Route, route
from pipeline.errors import InvalidMessage


@dataclass(frozen=True)
class Spec:
    """One run of one runner: where to read, where to write, how many messages, under which thresholds."""

    runner: str
    bootstrap: str
    group: str
    source: str
    tiers: dict[str, str]  # Tier value -> topic
    dlq: str
    messages: int
    # the thresholds document and settings the agent would read (one place: pipeline/core/thresholds.py)
    threshold_version: int
    length_threshold: int
    escalate_below: float
    abstain_above: float
    handover_above: float
    max_message_bytes: int
    vips: tuple[str, ...] = ()

    def dumps(self) -> str:
        return json.dumps({**self.__dict__, "vips": list(self.vips)})

    @classmethod
    def loads(cls, text: str) -> Spec:
        d = json.loads(text)
        return cls(**{**d, "vips": tuple(d.get("vips", ()))})


class Outgoing(NamedTuple):
    """One record to produce: to `topic` (a tier topic, or the DLQ when `tier` is None)."""

    topic: str
    key: bytes
    value: bytes
    tier: Tier | None


class Router:
    """Routes one request at a time; the envelope's batch-constant part is re-serialised once per millisecond."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.vips = frozenset(spec.vips)
        self.topics = {Tier(t): name for t, name in spec.tiers.items()}
        self._dests: dict[Route, tuple[str, bytes]] = {}
        self._ms = -1
        self._batch = self._envelope(0)

    def _envelope(self, now_ms: int) -> RoutedBatch:
        s = self.spec
        return RoutedBatch(s.threshold_version, s.escalate_below, now_ms, s.abstain_above, s.handover_above)

    def _dest(self, r: Route) -> tuple[str, bytes]:
        self._dests[r] = (self.topics[r.tier], RoutedBatch.route(r.tier, r.reason, r.degraded))
        return self._dests[r]

    def route(self, raw: bytes | None, key: bytes | None, timestamp_ms: int) -> Outgoing:
        """The routed record for one request (`timestamp_ms`: the Kafka record's timestamp, 0 if none)."""
        now_ms = int(time.time() * 1000)
        if now_ms != self._ms:
            self._ms, self._batch = now_ms, self._envelope(now_ms)
        d = fast_request(raw) if raw is not None else None
        if raw is None or d is None:
            return self._route_slow(raw, key, timestamp_ms, now_ms)
        user_id = d.get("user_id")
        feats = features.extract_fields(d["text"], d.get("lang"), False, 0, user_id in self.vips)
        r = route(feats, self.spec.length_threshold)
        topic, route_json = self._dests.get(r) or self._dest(r)
        value = self._batch.dump(raw, RoutedBatch.features(feats), timestamp_ms if timestamp_ms > 0 else
                                 (d.get("ts") or now_ms), route_json)
        return Outgoing(topic, key or (user_id or d["id"]).encode(), value, r.tier)

    def _route_slow(self, raw: bytes | None, key: bytes | None, timestamp_ms: int, now_ms: int) -> Outgoing:
        s = self.spec
        try:
            req = decode_request(raw, s.max_message_bytes)
            image_bytes = len(req.image.decode()) if req.image is not None else 0
        except InvalidMessage:
            return Outgoing(s.dlq, key or b"", raw or b"", None)
        feats = features.extract(req, vip=req.user_id in self.vips, image_bytes=image_bytes)
        r = route(feats, s.length_threshold)
        received = timestamp_ms if timestamp_ms > 0 else (req.ts or now_ms)
        fields = routed_fields(feats, r.tier, r.reason, r.degraded, s.threshold_version, s.escalate_below, received,
                               now_ms, s.abstain_above, s.handover_above)
        return Outgoing(self.topics[r.tier], key or (req.user_id or req.id).encode(), dump_routed(raw or b"{}", fields),
                        r.tier)


class Meter:
    """Throughput from the first output to the last: (count at the end - count at the start) / elapsed seconds.

    A per-message runtime starts it after its first message, a batch loop after its first batch, so neither counts
    start-up, group join or the first fetch.
    """

    def __init__(self) -> None:
        self.count = 0
        self.t0 = 0.0
        self.count0 = 0

    def add(self, n: int = 1) -> None:
        self.count += n
        if not self.t0:
            self.t0, self.count0 = time.perf_counter(), self.count

    def report(self, runner: str, t_end: float | None = None, **extra: Any) -> dict[str, Any]:
        """Print the result line the parent reads (`RESULT {json}`) and return it."""
        elapsed = (t_end or time.perf_counter()) - self.t0
        out = {"runner": runner, "messages": self.count, "timed": self.count - self.count0, "seconds": elapsed,
               "rate": (self.count - self.count0) / elapsed if elapsed > 0 else 0.0, **extra}
        sys.stdout.write("RESULT " + json.dumps(out) + "\n")
        sys.stdout.flush()
        return out


def confluent_versions() -> str:
    """"confluent-kafka X, librdkafka Y" of this interpreter (the Quix peer's differs from tierflow's)."""
    import confluent_kafka

    v = confluent_kafka.version()  # a (str, int) tuple before 2.13, a str since
    return f"confluent-kafka {v[0] if isinstance(v, tuple) else v}, librdkafka {confluent_kafka.libversion()[0]}"

"""Every Prometheus metric of tierflow, declared once. Base units: seconds, bytes, ratios 0-1."""

from __future__ import annotations

import logging
import os
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info
from prometheus_client.metrics_core import Metric

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

class OwnedGauge:
    """An unlabelled gauge exported only by the process that owns it: created (and registered) on its first set.

    prometheus_client exports a plain Gauge at 0 from every process that imports this module, so an aggregate
    over all of tierflow's processes (`min(tierflow_heavy_healthy)`) would read the non-owners' 0s: a false
    alert on a healthy stack, and 0 instead of "No data" when the owner is dead.
    """

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self._gauge: Gauge | None = None

    def _get(self) -> Gauge:
        if self._gauge is None:
            self._gauge = Gauge(self.name, self.documentation)
        return self._gauge

    def set(self, value: float) -> None:
        self._get().set(value)

    @property
    def exported(self) -> bool:
        return self._gauge is not None

    def describe(self) -> list[Metric]:
        return list(Gauge(self.name, self.documentation, registry=None).describe())


_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

# --- ingest ---
REQUESTS_IN = Counter("tierflow_requests_total", "Records read from the requests topics", ["source"])
ROUTED = Counter("tierflow_routed_total", "Requests routed, by tier and rule", ["tier", "reason"])
DEGRADED = Counter("tierflow_degraded_total", "Heavy-bound requests sent to light because heavy is unhealthy",
                   ["reason"])
DLQ = Counter("tierflow_dlq_total", "Records dead-lettered, by stage and error kind", ["stage", "kind"])
ROUTE_SECONDS = Histogram("tierflow_route_seconds", "Ingest time per consumed batch", buckets=_LATENCY_BUCKETS)
HEAVY_HEALTHY = OwnedGauge("tierflow_heavy_healthy", "1 while ingest considers the heavy tier healthy")

# --- workers ---
INFERENCE_SECONDS = Histogram("tierflow_inference_seconds", "Model time per message (batch time / size)",
                              ["tier", "model"], buckets=_LATENCY_BUCKETS)
END_TO_END_SECONDS = Histogram("tierflow_end_to_end_seconds", "Request received to answer produced",
                               ["tier", "model"], buckets=_LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram("tierflow_queue_seconds", "Routed to dequeued by a worker", ["tier"],
                          buckets=_LATENCY_BUCKETS)
BATCH_SIZE = Histogram("tierflow_batch_size", "Messages per micro-batch", ["tier"], buckets=_BATCH_BUCKETS)
ANSWERS = Counter("tierflow_answers_total", "Final answers produced", ["tier", "model"])
ESCALATED = Counter("tierflow_escalated_total", "Light predictions escalated to heavy", ["model"])
ABSTAINED = Counter("tierflow_abstained_total",
                    "Predictions whose out-of-scope score was over the tier's threshold (light: escalated)", ["tier"])
HANDOVERS = Counter("tierflow_handovers_total", "Requests handed over to a person, by the tier and why",
                    ["tier", "reason"])
SHADOWED = Counter("tierflow_shadow_total", "Light requests also sent to heavy for agreement tracking", [])
CONSUMER_LAG = Gauge("tierflow_consumer_lag", "Messages behind the high watermark (from fetch watermarks)",
                     ["topic", "group"])
WORKER_UP = Gauge("tierflow_worker_heartbeat_timestamp_seconds", "Last heartbeat of this worker",
                  ["tier", "worker"])

# --- thresholds / feedback ---
THRESHOLD = Gauge("tierflow_threshold", "Current threshold values", ["name"])
THRESHOLD_VERSION = OwnedGauge("tierflow_threshold_version", "Version of the thresholds in use")
THRESHOLDS_STALE = OwnedGauge("tierflow_thresholds_stale",
                              "1 while Redis is unreachable and last-known values serve")
MODEL_SCORE = Gauge("tierflow_model_score", "The design article's score per model", ["tier", "model"])
ACCURACY = Gauge("tierflow_accuracy", "Windowed accuracy against ground truth (or agreement proxy)",
                 ["tier", "source"])
HEAVY_SHARE = OwnedGauge("tierflow_heavy_share", "Share of final answers from the heavy tier in the window")
HANDOVER_SHARE = OwnedGauge("tierflow_handover_share",
                            "Share of final answers handed over to a person in the window (all tiers)")
TIER_P95 = Gauge("tierflow_tier_latency_p95_seconds", "Windowed p95 end-to-end latency per tier", ["tier"])

# --- infrastructure ---
BUILD = Info("tierflow_build", "The running build (exported as tierflow_build_info{version,commit} 1)")
BROKER_ERRORS = Counter("tierflow_broker_errors_total", "Kafka client errors", ["component", "code"])
REDIS_ERRORS = Counter("tierflow_redis_errors_total", "Redis errors", ["component"])
# The trainer agent (pipeline/agents/trainer.py)
LEARN_EXAMPLES = Counter("tierflow_learn_examples_total", "Examples offered to the trainer, by source and verdict "
                         "(accepted, or why not: the poisoning guards among them)", ["source", "verdict"])
LEARN_TRAININGS = Counter("tierflow_learn_trainings_total", "Light model retrainings, by outcome", ["outcome"])
LEARN_DECISIONS = Counter("tierflow_learn_decisions_total", "Light model versions promoted, rejected or rolled back",
                          ["action"])
SKIPPED = Counter("tierflow_skipped_total", "Records skipped: neither processable nor writable to the DLQ, even cut",
                  ["stage", "kind"])
DELIVERY_FAILED = Counter("tierflow_delivery_failed_total", "Produced records the broker did not accept",
                          ["topic"])


def serve(port: int | None) -> None:
    """Expose /metrics and /ready (pipeline/adapters/probes.py) on `port` (no-op for None). Multiprocess mode when
    PROMETHEUS_MULTIPROC_DIR is set."""
    if port is None:
        return
    from pipeline.adapters import probes
    from pipeline.version import commit, version

    BUILD.info({"version": version(), "commit": commit()})
    try:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import CollectorRegistry, multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            probes.start(port, registry)
        else:
            probes.start(port, REGISTRY)
    except OSError as e:
        raise ConfigError(f"TIERFLOW_METRICS_PORT={port}: cannot serve /metrics there ({e.strerror or e}); "
                          "expected a free port (`tierflow up --metrics-port BASE` gives each agent its own)") from None
    log.info("metrics on :%d/metrics, readiness on :%d/ready", port, port)


def observe_many(h: Histogram, values: Sequence[float]) -> None:
    """`h.observe(v)` for each of `values`, with one increment per bucket touched instead of one per value.

    A worker observes three histograms per message; at tens of thousands of messages a second the
    per-value path (a Python loop over the buckets, a lock per increment) costs more than the message.
    Uses prometheus-client's histogram internals (stable since 0.4; tests/unit/test_observe_many.py
    checks the result against observe()); falls back to observe() if they ever change.
    """
    bounds, buckets, total = getattr(h, "_upper_bounds", None), getattr(h, "_buckets", None), getattr(h, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for v in values:
            h.observe(v)
        return
    counts: dict[int, int] = {}
    for v in values:
        i = bisect_left(bounds, v)  # first bucket with v <= bound, as observe() picks it
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(values))
    for i, n in counts.items():
        buckets[i].inc(n)

"""Prometheus metrics of an agent worker, served at /metrics on the Faust web port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

REPORTS_ACCEPTED = Counter(
    "autoscaler_reports_accepted_total", "Metric reports folded into a window.", ["job"], registry=REGISTRY
)
REPORTS_REJECTED = Counter(
    "autoscaler_reports_rejected_total", "Metric reports dead-lettered, by reason.", ["reason"], registry=REGISTRY
)
WINDOWS_CLOSED = Counter("autoscaler_windows_closed_total", "Windows closed.", ["job"], registry=REGISTRY)
DECISIONS = Counter(
    "autoscaler_decisions_total", "Decisions published, by action and reason code.",
    ["job", "action", "code"], registry=REGISTRY,
)
RESCALES = Counter(
    "autoscaler_rescales_total", "Rescale lifecycle events, by type.", ["job", "type"], registry=REGISTRY
)
TRUE_RATE = Gauge(
    "autoscaler_true_processing_rate", "Job-level true processing rate per slot (rec/s).", ["job"],
    registry=REGISTRY,
)
UTILIZATION = Gauge("autoscaler_utilization", "Busy fraction of the job's slots.", ["job"], registry=REGISTRY)
BACKLOG = Gauge("autoscaler_backlog_records", "Records waiting at the source.", ["job"], registry=REGISTRY)
PARALLELISM = Gauge("autoscaler_parallelism", "Current parallelism.", ["job"], registry=REGISTRY)
RECOMMENDED = Gauge(
    "autoscaler_recommended_parallelism", "Parallelism of the latest decision.", ["job"], registry=REGISTRY
)
DECISION_LATENCY = Histogram(
    "autoscaler_window_to_decision_seconds", "Wall time from closing a window to publishing its decision.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5), registry=REGISTRY,
)

"""Prometheus metrics of an agent worker, served at /metrics on the Faust web port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

REGISTRY = CollectorRegistry(auto_describe=True)
# No `_created` sample beside each counter and histogram: in the text format Prometheus stores it as a
# series of its own, three more per job here, and a worker with thousands of jobs formats each on every
# scrape (`python -m bench.exposition`). Rates and increases need only the counters.
disable_created_metrics()

REPORTS_ACCEPTED = Counter(
    "autoscaler_reports_accepted_total", "Metric reports folded into a window.", ["job"], registry=REGISTRY
)
REPORTS_REJECTED = Counter(
    "autoscaler_reports_rejected_total", "Metric reports dead-lettered, by job (registered jobs only) and reason.",
    ["job", "reason"], registry=REGISTRY,
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
    "autoscaler_recommended_parallelism", "Parallelism the policy recommended in the latest window, before "
    "controls held or changed it.", ["job"], registry=REGISTRY,
)
TARGET = Gauge(
    "autoscaler_target_parallelism", "Parallelism of the latest decision, after the controls.", ["job"],
    registry=REGISTRY,
)
SUPPRESSIONS = Counter(
    "autoscaler_suppressions_total", "Recommended rescales a control held, by reason code.", ["job", "code"],
    registry=REGISTRY,
)
TRUE_OUTPUT_RATE = Gauge(
    "autoscaler_true_output_rate", "Job-level true output rate per slot (rec/s).", ["job"], registry=REGISTRY
)
ARRIVAL_RATE = Gauge("autoscaler_arrival_rate", "Records per second arriving at the source.", ["job"],
                     registry=REGISTRY)
DECISION_LATENCY = Histogram(
    "autoscaler_window_to_decision_seconds", "Wall time from closing a window to publishing its decision.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY,
)

"""Turn raw bytes from the metrics topic into a MetricReport, or a reason to dead-letter them."""

from __future__ import annotations

from pydantic import ValidationError

from contracts.dead_letters import Rejection
from contracts.messages import METRIC_REPORT_VERSION, MetricReport

# Bounds no real job reaches. The contract takes ints of any size and any finite float, but the
# monitor sums and divides them when it closes a window: 10**400 records or 1e308 busy seconds
# would overflow (OverflowError, or an inf the window contract refuses) and fail every retry.
MAX_QUANTITY = 1e15  # records, backlog, partitions, rates, busy seconds, state rows, bytes and seconds
MIN_INTERVAL_S = 1e-3  # throughput is divided by the observed time
MIN_TIMESTAMP = 1.0  # backlog growth is divided by timestamp differences

# Every reason parse_report gives; the window and registry checks add late_report,
# duplicate_report and unknown_job.
PARSE_REASONS = frozenset(
    {"empty", "oversize", "malformed_json", "unknown_schema_version", "invalid_report", "key_mismatch",
     "from_the_future"}
)


def parse_report(
    value: bytes | None,
    key: bytes | None,
    max_bytes: int,
    now: float,
    max_clock_skew_s: float,
) -> MetricReport | Rejection:
    if not value:
        return Rejection("empty", "the record has no value" if value is None else "the record's value is empty")
    if len(value) > max_bytes:
        return Rejection("oversize", f"{len(value)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        report = MetricReport.model_validate_json(value)
    except ValidationError as exc:
        return _classify(exc)
    implausible = _implausible(report)
    if implausible is not None:
        return Rejection("invalid_report", implausible)
    if key is not None and key.decode("utf-8", "replace") != report.job_id:
        return Rejection("key_mismatch", f"record key {key!r} differs from job_id {report.job_id!r}")
    if max_clock_skew_s > 0 and report.timestamp > now + max_clock_skew_s:
        return Rejection(
            "from_the_future",
            f"timestamp {report.timestamp:.3f} is {report.timestamp - now:.0f} s ahead of the clock "
            f"(allowed skew {max_clock_skew_s:.0f} s)",
        )
    return report


def _implausible(report: MetricReport) -> str | None:
    if report.timestamp < MIN_TIMESTAMP:
        return f"timestamp: must be at least {MIN_TIMESTAMP:g} (epoch seconds)"
    if report.interval_s < MIN_INTERVAL_S:
        return f"interval_s: must be at least {MIN_INTERVAL_S:g} s"
    quantities: dict[str, float | None] = {
        "records_in": report.records_in, "records_out": report.records_out, "busy_time_s": report.busy_time_s,
    }
    if report.source is not None:
        quantities |= {"source.arrival_rate": report.source.arrival_rate, "source.backlog": report.source.backlog,
                       "source.partitions": report.source.partitions}
    for i, op in enumerate(report.operators):
        quantities |= {f"operators.{i}.records_in": op.records_in, f"operators.{i}.records_out": op.records_out,
                       f"operators.{i}.busy_time_s": op.busy_time_s, f"operators.{i}.arrival_rate": op.arrival_rate}
    for i, state in enumerate(report.state):
        quantities |= {f"state.{i}.rows": state.rows, f"state.{i}.memory_bytes": state.memory_bytes,
                       f"state.{i}.commit_time_s": state.commit_time_s}
    for name, value in quantities.items():
        # int > float compares exactly in Python; printing a huge int could itself fail, so it is not shown.
        if value is not None and value > MAX_QUANTITY:
            return f"{name}: exceeds the plausible maximum of {MAX_QUANTITY:g}"
    return None


def _classify(exc: ValidationError) -> Rejection:
    errors = exc.errors(include_url=False)
    if any(e["type"] in ("json_invalid", "json_type") for e in errors):
        return Rejection("malformed_json", errors[0]["msg"])
    if any(e["loc"][:1] == ("schema_version",) for e in errors):
        return Rejection(
            "unknown_schema_version", f"this monitor reads metric-report schema version {METRIC_REPORT_VERSION}"
        )
    detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'report'}: {e['msg']}" for e in errors[:10])
    return Rejection("invalid_report", detail)

"""Turn raw bytes from the metrics topic into a MetricReport, or a reason to dead-letter them."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from pydantic import ValidationError

from agent.contracts import METRIC_REPORT_VERSION, DeadLetter, MetricReport

# Dead letters keep the rejected bytes whole up to this size (base64 grows them by a third and
# Kafka's default record limit is 1 MiB).
PAYLOAD_KEEP_BYTES = 700 * 1024
PREVIEW_CHARS = 512


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str


def parse_report(
    value: bytes | None,
    key: bytes | None,
    max_bytes: int,
    now: float,
    max_clock_skew_s: float,
) -> MetricReport | Rejection:
    if value is None:
        return Rejection("empty", "the record has no value")
    if len(value) > max_bytes:
        return Rejection("oversize", f"{len(value)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        report = MetricReport.model_validate_json(value)
    except ValidationError as exc:
        return _classify(exc)
    if key is not None and key.decode("utf-8", "replace") != report.job_id:
        return Rejection("key_mismatch", f"record key {key!r} differs from job_id {report.job_id!r}")
    if max_clock_skew_s > 0 and report.timestamp > now + max_clock_skew_s:
        return Rejection(
            "from_the_future",
            f"timestamp {report.timestamp:.3f} is {report.timestamp - now:.0f} s ahead of the clock "
            f"(allowed skew {max_clock_skew_s:.0f} s)",
        )
    return report


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


def dead_letter(
    topic: str,
    value: bytes | None,
    key: bytes | None,
    rejection: Rejection,
    stage: str,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    raw = value or b""
    return DeadLetter(
        source_topic=topic,
        reason=rejection.reason,
        detail=rejection.detail,
        key=None if key is None else key.decode("utf-8", "replace"),
        payload_base64=base64.b64encode(raw[:PAYLOAD_KEEP_BYTES]).decode(),
        payload_preview=raw[:PREVIEW_CHARS].decode("utf-8", "replace"),
        payload_bytes=len(raw),
        payload_truncated=len(raw) > PAYLOAD_KEEP_BYTES,
        stage=stage,
        partition=partition,
        offset=offset,
    )

"""Bad input on the metrics topic: whatever the bytes, the monitor accepts or refuses with a reason.

Properties over arbitrary bytes, arbitrary JSON and mutated valid reports (parse_report), and the
size limit. The window rules for shuffled, late and duplicated reports: test_window_rules.py."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.dead_letters import DeadLetter, Rejection, dead_letter
from contracts.messages import MetricReport, MetricWindow
from contracts.stage import Incoming
from monitor.kernel import parse as kernel_parse
from monitor.validation import MAX_QUANTITY, PARSE_REASONS, parse_report
from monitor.windows import WindowState, add_report, close_window

NOW = 2_000_000_000.0
LIMIT = 64 * 1024
SKEW = 300.0
INTERVAL = 10.0
KEY = b"job"

# Enough examples to find the rare shapes, few enough for a 2-core machine.
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parse(value: bytes | None, key: bytes | None = KEY, max_bytes: int = LIMIT) -> MetricReport | Rejection:
    return parse_report(value, key, max_bytes, NOW, SKEW)


def check_outcome(value: bytes | None, key: bytes | None, result: MetricReport | Rejection) -> None:
    """The contract with the agent: a report that closes a window cleanly, or a reason to dead-letter."""
    if isinstance(result, Rejection):
        assert result.reason in PARSE_REASONS, result
        assert isinstance(result.detail, str) and result.detail, result
        letter = dead_letter("metrics", value, key, result, "monitor", 0, 1)
        assert DeadLetter.model_validate_json(letter.to_bytes()).reason == result.reason
        return
    assert isinstance(result, MetricReport)
    assert result.timestamp <= NOW + SKEW
    closes_cleanly(result)


def closes_cleanly(report: MetricReport) -> None:
    """Two workers' copies of an accepted report fold, survive knowledge's JSON round trip and close
    into a window that analyze can read back: no overflow, no inf, no exception."""
    state, _ = add_report(None, report, INTERVAL, 0, 0)
    state, _ = add_report(state, report.model_copy(update={"worker_id": "other-worker"}), INTERVAL, 0, 1)
    state = WindowState.from_dict(json.loads(json.dumps(state.to_dict())))
    window = close_window(state, report.job_id, INTERVAL)
    again = MetricWindow.model_validate_json(window.to_bytes())
    assert again.report_count == 2
    numbers = [again.observed_s, again.busy_time_s, *(w.throughput for w in again.worker_loads)]
    if again.source is not None:
        numbers += [again.source.arrival_rate, again.source.backlog_growth_rate]
    assert all(math.isfinite(n) for n in numbers), again


# ---------------------------------------------------------------- strategies

finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=10**9)


@st.composite
def valid_reports(draw: st.DrawFn) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema_version": 1,
        "job_id": "job",
        "timestamp": draw(st.floats(min_value=1.0, max_value=NOW + SKEW, allow_nan=False)),
        "interval_s": draw(st.floats(min_value=1e-3, max_value=3600, allow_nan=False)),
        "worker_id": draw(st.text(min_size=1, max_size=12)),
        "parallelism": draw(st.integers(1, 100_000)),
        "records_in": draw(counts),
        "records_out": draw(counts),
        "busy_time_s": draw(finite),
    }
    if draw(st.booleans()):
        report["cpu_utilization"] = draw(st.floats(0, 1))
    if draw(st.booleans()):
        report["source"] = {"arrival_rate": draw(finite), "backlog": draw(counts),
                            "partitions": draw(st.integers(1, 10_000)), "splittable": draw(st.booleans())}
    if draw(st.booleans()):
        report["operators"] = [
            {"operator_id": "src", "parallelism": 1, "records_in": draw(counts), "records_out": draw(counts),
             "busy_time_s": draw(finite), "arrival_rate": draw(finite)},
            {"operator_id": "sink", "upstream": ["src"], "parallelism": 2, "records_in": draw(counts),
             "records_out": draw(counts), "busy_time_s": draw(finite)},
        ]
    if draw(st.booleans()):
        report["shuffle_partitions"] = draw(st.integers(1, 10_000))
        report["state"] = [{"operator": "stateStoreSave", "rows": draw(counts), "memory_bytes": draw(counts),
                            "commit_time_s": draw(finite),
                            "partitions": draw(st.none() | st.integers(1, report["shuffle_partitions"]))}]
    for lag in ("watermark_lag_s", "output_lag_s"):
        if draw(st.booleans()):
            report[lag] = draw(st.floats(0, 31_536_000))
    return report


json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.sampled_from([10**15 + 1, 10**400, -(10**400), 2**63, 2**64, 1e308, -1e308, 5e-324, -0.0])
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)
# Values a numeric field should never take; a number field receiving them is out of range or retyped.
hostile_numbers = st.sampled_from(
    [-1, -1e-9, 0, -0.0, 1e-300, 5e-324, 1e15 + 1, 1e16, 1e308, 10**15 + 1, 10**400, 2**64,
     math.nan, math.inf, -math.inf, "many", "1e3", True, None, [], {}]
)


def slots(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every value in a JSON tree."""
    found: list[tuple[Any, ...]] = []
    if isinstance(tree, dict):
        items: Any = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return found
    for k, v in items:
        found.append((*path, k))
        found += slots(v, (*path, k))
    return found


def container(tree: Any, path: tuple[Any, ...]) -> Any:
    for step in path[:-1]:
        tree = tree[step]
    return tree


@st.composite
def mutated_reports(draw: st.DrawFn) -> bytes:
    """A valid report with one to three mutations: dropped, replaced, retyped or hostile fields,
    unicode keys, a wrong version, then maybe truncated or bit-flipped bytes."""
    report = draw(valid_reports())
    for _ in range(draw(st.integers(1, 3))):
        paths = slots(report)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = container(report, path)
        op = draw(st.sampled_from(["drop", "replace", "hostile", "extra_key", "version"]))
        if op == "drop":
            if isinstance(parent, list):
                parent.pop(path[-1])
            else:
                parent.pop(path[-1], None)
        elif op == "replace":
            parent[path[-1]] = draw(json_values)
        elif op == "hostile":
            parent[path[-1]] = draw(hostile_numbers)
        elif op == "extra_key" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
        elif op == "version":
            report["schema_version"] = draw(json_scalars)
    raw = json.dumps(report).encode()  # NaN and Infinity become JSON's non-standard tokens
    tail = draw(st.sampled_from(["keep", "truncate", "flip"]))
    if tail == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif tail == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    return raw


keys = st.none() | st.just(KEY) | st.binary(max_size=16)


# ---------------------------------------------------------------- (a) never raises


@FAST
@given(st.binary(max_size=4096), keys)
def test_arbitrary_bytes_are_accepted_or_rejected_with_a_known_reason(value: bytes, key: bytes | None) -> None:
    check_outcome(value, key, parse(value, key))


@FAST
@given(json_values, keys)
def test_arbitrary_json_is_accepted_or_rejected_with_a_known_reason(tree: Any, key: bytes | None) -> None:
    value = json.dumps(tree).encode()
    check_outcome(value, key, parse(value, key))


@FAST
@given(mutated_reports(), keys)
def test_mutated_reports_are_accepted_or_rejected_with_a_known_reason(value: bytes, key: bytes | None) -> None:
    check_outcome(value, key, parse(value, key))


@FAST
@given(valid_reports())
def test_valid_reports_are_accepted_and_close_cleanly(report: dict[str, Any]) -> None:
    value = json.dumps(report).encode()
    result = parse(value)
    assert isinstance(result, MetricReport), result
    check_outcome(value, KEY, result)


NUMBER_FIELDS = [
    ("timestamp",), ("interval_s",), ("parallelism",), ("records_in",), ("records_out",), ("busy_time_s",),
    ("cpu_utilization",), ("shuffle_partitions",), ("source", "arrival_rate"), ("source", "backlog"),
    ("source", "partitions"), ("operators", 0, "records_in"), ("operators", 0, "records_out"),
    ("operators", 0, "busy_time_s"), ("operators", 0, "arrival_rate"), ("operators", 1, "parallelism"),
    ("state", 0, "rows"), ("state", 0, "memory_bytes"), ("state", 0, "commit_time_s"), ("state", 0, "partitions"),
    ("watermark_lag_s",), ("output_lag_s",),
]
any_number = (
    st.integers() | st.integers(min_value=10**12, max_value=10**500) | st.floats()
    | st.floats(min_value=1e12, max_value=1e308) | st.floats(min_value=0, max_value=1e-12)
)


@FAST
@given(valid_reports(), st.sampled_from(NUMBER_FIELDS), any_number)
def test_any_number_in_any_numeric_field_is_accepted_or_rejected(
    report: dict[str, Any], path: tuple[Any, ...], number: float
) -> None:
    report.setdefault("source", {"arrival_rate": 1.0, "backlog": 0, "partitions": 1})
    report.setdefault("operators", [
        {"operator_id": "src", "parallelism": 1, "records_in": 1, "records_out": 1, "busy_time_s": 0.1},
        {"operator_id": "sink", "upstream": ["src"], "parallelism": 2, "records_in": 1, "records_out": 1,
         "busy_time_s": 0.1},
    ])
    report.setdefault("state", [{"operator": "stateStoreSave", "rows": 1, "memory_bytes": 1, "partitions": 1}])
    container(report, path)[path[-1]] = number
    value = json.dumps(report).encode()
    check_outcome(value, KEY, parse(value))


@pytest.mark.parametrize(
    ("field", "value"),
    [("records_in", 10**400), ("records_in", 10**15 + 1), ("busy_time_s", 1e308), ("interval_s", 1e-300),
     ("timestamp", 5e-324)],
)
def test_magnitudes_that_would_overflow_a_window_are_invalid(field: str, value: float) -> None:
    """These once passed validation and then crashed the monitor when their window closed."""
    report = {"job_id": "job", "timestamp": 1005.0, "interval_s": 1.0, "parallelism": 2, "records_in": 1,
              "records_out": 1, "busy_time_s": 0.5} | {field: value}
    result = parse(json.dumps(report).encode())
    assert isinstance(result, Rejection) and result.reason == "invalid_report", result
    assert field in result.detail


@pytest.mark.parametrize(("field", "value"), [("rows", 10**400), ("memory_bytes", 10**15 + 1),
                                              ("commit_time_s", 1e308)])
def test_state_magnitudes_that_would_overflow_a_window_are_invalid(field: str, value: float) -> None:
    state = {"operator": "stateStoreSave", "rows": 1, "memory_bytes": 1, "commit_time_s": 0.1} | {field: value}
    report = {"job_id": "job", "timestamp": 1005.0, "interval_s": 1.0, "parallelism": 2, "records_in": 1,
              "records_out": 1, "busy_time_s": 0.5, "state": [state]}
    result = parse(json.dumps(report).encode())
    assert isinstance(result, Rejection) and result.reason == "invalid_report", result
    assert f"state.0.{field}" in result.detail


def test_the_largest_plausible_report_closes_cleanly() -> None:
    big = int(MAX_QUANTITY)
    report = {"job_id": "job", "timestamp": 1.0 + 1e-9, "interval_s": 1e-3, "parallelism": 100_000,
              "records_in": big, "records_out": big, "busy_time_s": MAX_QUANTITY,
              "source": {"arrival_rate": MAX_QUANTITY, "backlog": big, "partitions": big}}
    result = parse(json.dumps(report).encode())
    assert isinstance(result, MetricReport), result
    closes_cleanly(result)


def test_empty_and_null_values_are_empty() -> None:
    for value in (None, b""):
        result = parse(value)
        assert isinstance(result, Rejection) and result.reason == "empty" and result.detail


def test_deeply_nested_json_is_malformed_not_a_recursion_error() -> None:
    for value in (b"[" * 60_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000):
        result = parse(value)
        assert isinstance(result, Rejection) and result.reason == "malformed_json", result


# ---------------------------------------------------------------- (b) size limit


@FAST
@given(st.integers(1024, 4096), st.integers(-64, 64), st.booleans())
def test_any_payload_beyond_the_limit_is_oversize_whatever_it_holds(limit: int, delta: int, valid: bool) -> None:
    size = max(1, limit + delta)
    if valid:  # a valid report padded with spaces, which JSON allows, to exactly `size` bytes
        body = json.dumps({"job_id": "job", "timestamp": 1005.0, "interval_s": 1.0, "parallelism": 2,
                           "records_in": 1, "records_out": 1, "busy_time_s": 0.5}).encode()
        value = body + b" " * max(0, size - len(body))
    else:
        value = b"x" * size
    result = parse(value, max_bytes=limit)
    if len(value) > limit:
        assert isinstance(result, Rejection) and result.reason == "oversize", result
        assert str(len(value)) in result.detail and str(limit) in result.detail
    else:
        assert not (isinstance(result, Rejection) and result.reason == "oversize")
        assert isinstance(result, MetricReport) == valid


def test_the_default_limit_is_inclusive() -> None:
    body = json.dumps({"job_id": "job", "timestamp": 1005.0, "interval_s": 1.0, "parallelism": 2, "records_in": 1,
                       "records_out": 1, "busy_time_s": 0.5}).encode()
    exactly = body + b" " * (LIMIT - len(body))
    assert isinstance(parse(exactly), MetricReport)
    over = parse(exactly + b" ")
    assert isinstance(over, Rejection) and over.reason == "oversize"


# ---------------------------------------------------------------- a query's state, through the monitor kernel

STATEFUL = {"job_id": "job", "timestamp": 1005.0, "interval_s": 1.0, "worker_id": "driver", "parallelism": 2,
            "records_in": 10, "records_out": 10, "busy_time_s": 0.5, "shuffle_partitions": 8,
            "state": [{"operator": "stateStoreSave", "rows": 20, "memory_bytes": 70200, "commit_time_s": 0.4,
                       "partitions": 8}],
            "watermark_lag_s": 7.3, "output_lag_s": 9.0}


def through_kernel(report: dict[str, Any]) -> MetricReport | DeadLetter:
    """One record through `monitor.kernel.parse`: the report it accepts or the dead letter it writes."""
    parsed = kernel_parse([Incoming(json.dumps(report).encode(), KEY, "metrics", 0, 7)], "metrics", LIMIT, NOW, SKEW)
    if parsed.rejected:
        return DeadLetter.model_validate_json(parsed.rejected[0].to_bytes())
    return parsed.accepted[0][0]


def with_state(**fields: Any) -> dict[str, Any]:
    return STATEFUL | {"state": [STATEFUL["state"][0] | fields]}


@pytest.mark.parametrize(("report", "names"), [
    (with_state(memory_bytes=-1), "state.0.memory_bytes"),
    (with_state(rows=-5), "state.0.rows"),
    (with_state(commit_time_s=-0.1), "state.0.commit_time_s"),
    (with_state(partitions=0), "state.0.partitions"),
    (with_state(partitions=9), "more than the 8 shuffle partitions"),
    (with_state(operator=""), "state.0.operator"),
    (STATEFUL | {"watermark_lag_s": -1.0}, "watermark_lag_s"),
    (STATEFUL | {"output_lag_s": 4e7}, "output_lag_s"),
])
def test_state_out_of_range_or_inconsistent_is_dead_lettered_with_a_reason_naming_the_field(
        report: dict[str, Any], names: str) -> None:
    letter = through_kernel(report)
    assert isinstance(letter, DeadLetter), letter
    assert letter.reason == "invalid_report" and letter.stage == "monitor" and names in letter.detail, letter


def test_a_report_whose_state_partitions_could_not_be_read_is_accepted_and_closes() -> None:
    report = through_kernel(with_state(partitions=None))
    assert isinstance(report, MetricReport) and report.state[0].partitions is None
    closes_cleanly(report)
    state, _ = add_report(None, report, INTERVAL, 0, 0)
    window = close_window(state, "job", INTERVAL)
    assert window.state is not None and window.state.partitions is None and window.state.rows == 20


def test_reports_without_the_state_fields_stay_valid() -> None:
    old = {"schema_version": 1, "job_id": "job", "timestamp": 1005.0, "interval_s": 1.0, "worker_id": "driver",
           "parallelism": 2, "records_in": 10, "records_out": 10, "busy_time_s": 0.5, "shuffle_partitions": 8,
           "source": {"arrival_rate": 10.0, "backlog": 0, "partitions": 1}}
    report = through_kernel(old)
    assert isinstance(report, MetricReport)
    assert (report.state, report.watermark_lag_s, report.output_lag_s) == ([], None, None)
    state, _ = add_report(None, report, INTERVAL, 0, 0)
    assert "state" not in state.to_dict()["workers"]["driver"]
    window = close_window(state, "job", INTERVAL)
    assert (window.state, window.watermark_lag_s, window.output_lag_s) == (None, None, None)

"""True rates and per-job configuration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyze.true_rates import analyze_window
from contracts.jobs import ConfigError, JobConfig, parse_assignments, validate_overrides
from contracts.messages import MetricWindow, OperatorWindow, SourceWindow
from contracts.settings import Settings


def window(**overrides: object) -> MetricWindow:
    base: dict[str, object] = {
        "job_id": "job", "window_start": 0.0, "window_end": 10.0, "observed_s": 10.0, "report_count": 10,
        "workers": 1, "parallelism": 4, "parallelism_changed": False, "records_in": 2000, "records_out": 1000,
        "busy_time_s": 20.0,
        "source": SourceWindow(arrival_rate=250.0, backlog=100, backlog_growth_rate=5.0, partitions=4,
                               splittable=True),
    }
    return MetricWindow.model_validate(base | overrides)


def test_true_rates_are_records_per_useful_second() -> None:
    a = analyze_window(window())
    assert a.valid
    assert a.true_processing_rate == pytest.approx(100.0)  # 2000 records / 20 busy s
    assert a.true_output_rate == pytest.approx(50.0)
    assert a.observed_processing_rate == pytest.approx(200.0)
    assert a.utilization == pytest.approx(0.5)  # 20 busy s / (10 s x 4 slots)
    assert (a.arrival_rate, a.backlog) == (250.0, 100)


@given(records=st.integers(1, 10**7), busy=st.floats(0.1, 1e4), waiting=st.floats(0, 1e4))
def test_true_rate_ignores_waiting_time(records: int, busy: float, waiting: float) -> None:
    """Observed rates fall when an operator waits; the true rate does not (DS2's premise)."""
    a = analyze_window(window(records_in=records, busy_time_s=busy, observed_s=busy + waiting + 1, parallelism=1))
    assert a.true_processing_rate == pytest.approx(records / busy)
    assert a.observed_processing_rate <= a.true_processing_rate


def test_operator_rates() -> None:
    ops = [OperatorWindow(operator_id="map", upstream=[], parallelism=2, records_in=600, records_out=1200,
                          busy_time_s=3.0)]
    (o,) = analyze_window(window(operators=ops)).operators
    assert (o.true_processing_rate, o.true_output_rate) == (200.0, 400.0)
    assert o.utilization == pytest.approx(0.15)


def test_invalid_windows_and_the_idle_fallback() -> None:
    mixed = analyze_window(window(parallelism_changed=True))
    assert not mixed.valid and "rescale" in (mixed.invalid_reason or "")
    idle = window(records_in=0, records_out=0, busy_time_s=0.0)
    assert not analyze_window(idle).valid
    borrowed = analyze_window(idle, fallback={"true_processing_rate": 90.0, "true_output_rate": 45.0})
    assert borrowed.valid and borrowed.true_processing_rate == 90.0 and borrowed.observed_processing_rate == 0
    # A window spanning a rescale never borrows: its parallelism is in doubt.
    assert not analyze_window(window(records_in=0, parallelism_changed=True), {"true_processing_rate": 1}).valid


def test_config_defaults_come_from_settings_and_bad_values_are_refused() -> None:
    settings = Settings(target_utilization=0.6, max_parallelism=16)
    config = JobConfig.resolve(settings, {})
    assert (config.target_utilization, config.max_parallelism) == (0.6, 16)
    assert validate_overrides(settings, {}, {"mode": "recommend"}).mode.value == "recommend"
    for bad in ({"target_utilization": "1.5"}, {"mode": "sometimes"}, {"min_parallelism": "20"}):
        with pytest.raises(ConfigError, match="invalid configuration"):
            validate_overrides(settings, {}, bad)
    with pytest.raises(ConfigError, match="unknown setting"):
        parse_assignments(["colour=blue"])
    with pytest.raises(ConfigError, match="key=value"):
        parse_assignments(["mode"])


@given(overhead=st.floats(0.0, 3.0), per_slot=st.floats(10.0, 1000.0), parallelism=st.integers(1, 16),
       sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=20))
def test_batch_overhead_recovers_the_fixed_cost_of_batches_whose_time_is_overhead_plus_work(
    overhead: float, per_slot: float, parallelism: int, sizes: list[int]
) -> None:
    # A batch of n records takes overhead + n / (parallelism x per_slot) on the wall clock, and its
    # tasks are busy n / per_slot seconds summed over the slots.
    records = sum(sizes)
    busy = records / per_slot
    batch_time = sum(overhead + n / (parallelism * per_slot) for n in sizes)
    a = analyze_window(window(records_in=records, busy_time_s=busy, parallelism=parallelism,
                              batches=len(sizes), batch_time_s=batch_time))
    assert a.batch_overhead_s == pytest.approx(overhead, abs=1e-6)
    assert a.batch_work_s == pytest.approx(records / per_slot / parallelism / len(sizes))


def test_batch_overhead_is_unknown_without_batch_metrics_or_across_a_rescale() -> None:
    assert analyze_window(window()).batch_overhead_s is None
    assert analyze_window(window(batches=0, batch_time_s=0.0)).batch_overhead_s is None
    rescaled = window(batches=5, batch_time_s=9.0, parallelism_changed=True)
    assert analyze_window(rescaled).batch_overhead_s is None
    assert analyze_window(window(batches=5, batch_time_s=9.0)).batch_overhead_s == pytest.approx((9.0 - 5.0) / 5)

"""Recovery-time prediction, Daedalus's Algorithm 1 and the observed recovery time (anomaly detection)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from analyze.anomaly import RecoveryDetector
from contracts.plan_state import Downtimes
from plan.recovery import (
    Choice,
    choose_scale_out,
    forecast_max,
    integrate_forecast,
    predict_recovery,
    predict_recovery_time,
    replay_records,
)

# ---------------------------------------------------------------- predicted recovery time


def test_recovery_time_by_hand() -> None:
    # 10 s checkpoint interval at 600 rec/s: 6000 records to replay; 30 s down at 600 rec/s: 18000
    # more; plus a backlog of 20000: 44000 records, drained by 1000 - 600 = 400 rec/s in 110 s.
    replay = replay_records(10.0, 600.0)
    predicted = predict_recovery(1000.0, [600.0] * 900, 1.0, backlog=20_000, downtime_s=30.0, replay_records=replay)
    assert replay == 6000.0
    assert predicted.downtime_records == pytest.approx(18_000.0)
    assert predicted.accumulated_records == pytest.approx(44_000.0)
    assert predicted.seconds == pytest.approx(30.0 + 110.0)


def test_recovery_ends_at_the_backlog_the_detector_calls_normal() -> None:
    # As above, but caught up at 10 s of arrivals (6000 records) left: 38000 to drain, 95 s.
    predicted = predict_recovery(1000.0, [600.0] * 900, 1.0, backlog=20_000, downtime_s=30.0,
                                 replay_records=6000.0, caught_up_records=6000.0)
    assert predicted.seconds == pytest.approx(30.0 + 95.0)
    # A short restart whose backlog stays within the tolerance is over when the job is back.
    short = predict_recovery(1000.0, [100.0] * 900, 1.0, backlog=0, downtime_s=9.0, replay_records=50.0,
                             caught_up_records=1000.0)
    assert short.seconds == pytest.approx(9.0)


def test_recovery_integrates_a_changing_forecast_step_by_step() -> None:
    forecast = [500.0, 900.0, 500.0]  # 10 s steps
    # Down 5 s at 500 rec/s: 2500 records, +1000 backlog = 3500. 5-10 s: spare 500 x 5 = 2500;
    # 10-20 s: spare 100 x 10 = 1000: caught up at 20 s.
    assert predict_recovery_time(1000.0, forecast, 10.0, 1000, 5.0, 0.0) == pytest.approx(20.0)
    # At 800 rec/s the peak outruns the job: down 10 s (5000) + 1000 = 6000; 10-20 s: -100 x 10 -> 7000;
    # 20-30 s: 300 x 10 -> 4000 left when the forecast ends.
    assert predict_recovery_time(800.0, forecast, 10.0, 1000, 10.0, 0.0) == math.inf
    # Holding the last rate 100 s past the horizon: 4000 / 300 s more.
    assert predict_recovery_time(800.0, forecast, 10.0, 1000, 10.0, 0.0, beyond_horizon_s=100.0) == pytest.approx(
        30.0 + 4000.0 / 300.0
    )


@pytest.mark.parametrize("capacity", [600.0, 599.0, 0.0])
def test_recovery_is_infinite_without_spare_capacity(capacity: float) -> None:
    assert predict_recovery_time(capacity, [600.0] * 100, 1.0, 10, 5.0, 0.0, beyond_horizon_s=1e6) == math.inf


def test_nothing_to_catch_up_recovers_when_the_job_is_back() -> None:
    assert predict_recovery_time(500.0, [0.0] * 10, 1.0, 0, 7.0, 0.0) == 7.0
    assert predict_recovery_time(500.0, [600.0] * 10, 1.0, 0, 0.0, 0.0) == 0.0


def test_forecast_helpers() -> None:
    forecast = [100.0, 200.0, 300.0]  # 10 s steps
    assert integrate_forecast(forecast, 10.0, 5.0, 15.0) == pytest.approx(5 * 100 + 5 * 200)
    assert integrate_forecast(forecast, 10.0, 25.0, 45.0) == pytest.approx(20 * 300)  # last rate holds
    assert forecast_max(forecast, 10.0, 10.0) == 100.0
    assert forecast_max(forecast, 10.0, 10.5) == 200.0
    assert forecast_max(forecast, 10.0, math.inf) == 300.0
    with pytest.raises(ValueError):
        predict_recovery_time(100.0, [], 1.0, 0, 0.0, 0.0)


def test_expected_downtime_is_the_longest_recent_one_per_direction() -> None:
    raw = {"up": [80.0, 20.0, 25.0, 22.0, 21.0, 24.0], "down": [12.0]}
    measured = Downtimes.model_validate(raw)
    assert measured.expected("up", 30.0) == 25.0  # the 80 s outlier aged out of the last 5
    assert measured.expected("up", 30.0, recent=6) == 80.0
    assert measured.expected("up", 30.0, recent=6, cap_s=60.0) == 60.0
    assert measured.expected("down", 15.0) == 12.0
    assert Downtimes().expected("down", 15.0) == 15.0


# ---------------------------------------------------------------- Algorithm 1


def per_slot(rate: float) -> Callable[[int], float]:
    return lambda p: rate * p


def choose(**overrides: Any) -> Choice:
    args: dict[str, Any] = {
        "current": 2, "candidates": range(1, 9), "capacity_of": per_slot(250.0), "forecast": [600.0] * 900,
        "step_s": 1.0, "backlog": 0.0, "downtime_up": 30.0, "downtime_down": 15.0, "target_recovery_s": 600.0,
        "checkpoint_replay_records": 6000.0,
    }
    return choose_scale_out(**(args | overrides))


def test_algorithm_picks_the_smallest_sufficient_candidate() -> None:
    choice = choose()
    # 1 and 2 slots (250, 500 rec/s) cannot carry 600 rec/s. 3 slots: (6000 + 30 x 600) / 150 = 160 s
    # after 30 s down: 190 s <= 600 s.
    assert choice.parallelism == 3
    assert choice.reason == "smallest_sufficient"
    assert choice.predicted_recovery_s == pytest.approx(190.0)
    assert set(choice.rejected) == {1, 2}
    assert choice.numbers["capacity"] == pytest.approx(750.0)


def test_a_tight_recovery_target_needs_more_slots() -> None:
    choice = choose(target_recovery_s=100.0)
    # 3 slots recover in 190 s > 100 s; 4 slots: 24000 / 400 = 60 s + 30 s = 90 s.
    assert choice.parallelism == 4
    assert choice.predicted_recovery_s == pytest.approx(90.0)
    assert "recovery 190 s > target 100 s" in choice.rejected[3]


def test_a_forecast_peak_makes_the_decision_long_lived() -> None:
    choice = choose(forecast=[600.0] * 300 + [800.0] * 600)
    assert choice.parallelism == 4  # 750 rec/s would recover, but not carry the later 800 rec/s
    assert "not long-lived" in choice.rejected[3]


def test_no_scale_in_while_the_backlog_cannot_drain_in_time() -> None:
    common = {"current": 6, "forecast": [400.0] * 900, "target_recovery_s": 3600.0, "checkpoint_replay_records": 0.0}
    assert choose(**common, backlog=0.0).parallelism == 2  # the load allows 2 slots
    choice = choose(**common, backlog=200_000.0)
    # 2 slots would even recover within the target (2075 s), but would need 200000 / 100 = 2000 s to
    # drain the backlog; 3 to 5 slots also need more than 60 s: stay at 6 until caught up.
    assert choice.parallelism == 6
    assert choice.reason == "current_sufficient"
    # Staying means recovering from a failure: the longer (30 s) downtime, 30 x 400 + 200000 records.
    assert choice.numbers["downtime_s"] == 30.0
    assert choice.predicted_recovery_s == pytest.approx(30.0 + 212_000 / 1100)
    assert "scale-in waits" in choice.rejected[2]
    assert "scale-in waits" in choice.rejected[5]


def test_a_recent_rescale_holds_while_the_current_scale_out_suffices() -> None:
    held = choose(current=4, since_last_rescale_s=100.0)
    assert (held.parallelism, held.reason) == (4, "recent_rescale_holds")
    later = choose(current=4, since_last_rescale_s=700.0)
    assert later.parallelism == 3
    overloaded = choose(current=2, since_last_rescale_s=100.0)  # 500 rec/s < 600: no hold
    assert overloaded.parallelism == 3


def test_the_observed_rate_rules_out_small_candidates() -> None:
    choice = choose(observed_rate=900.0)
    assert choice.parallelism == 4
    assert "observed 900.0" in choice.rejected[3]


def test_when_nothing_suffices_the_largest_candidate_is_chosen() -> None:
    choice = choose(capacity_of=per_slot(50.0))
    assert choice.parallelism == 8
    assert choice.reason == "none_sufficient"
    assert choice.predicted_recovery_s == math.inf
    assert choice.numbers["predicted_recovery_s"] is None  # JSON-able
    json.dumps(choice.numbers)


# ---------------------------------------------------------------- observed recovery time


def trained_detector(**settings: float) -> RecoveryDetector:
    detector = RecoveryDetector(**settings)
    for i in range(20):  # normal operation: the lag rate alternates +5 / -5 rec/s
        assert detector.observe(i * 10.0, 600.0, 595.0 if i % 2 == 0 else 605.0, backlog=3000) is None
    return detector


RECOVERY = [  # (time, throughput) at 600 rec/s arrivals after a rescale at t = 200
    (210.0, 0.0), (220.0, 0.0), (230.0, 0.0),  # down
    (240.0, 1000.0), (250.0, 1000.0), (260.0, 1000.0), (270.0, 1000.0),  # catching up
    (280.0, 597.0), (290.0, 603.0),  # normal twice ...
    (300.0, 640.0),  # ... but not sustained
    (310.0, 598.0), (320.0, 601.0), (330.0, 600.0),  # back to normal for good from 310 s
]


def test_recovery_ends_after_sustained_normal_points() -> None:
    detector = trained_detector()
    detector.start_recovery(200.0)
    results = [detector.observe(t, 600.0, y) for t, y in RECOVERY]
    assert results[:-1] == [None] * (len(RECOVERY) - 1)
    assert results[-1] == pytest.approx(110.0)  # 310 s - 200 s
    assert not detector.recovering
    assert detector.last_recovery_s == pytest.approx(110.0)
    count = detector.normal.count
    detector.observe(340.0, 600.0, 600.0)
    assert detector.normal.count == count + 1  # outside a recovery, points teach the normal band


def test_without_sustain_the_first_normal_point_ends_recovery() -> None:
    detector = trained_detector(sustain=1)
    detector.start_recovery(200.0)
    results = [detector.observe(t, 600.0, y) for t, y in RECOVERY]
    assert results[7] == pytest.approx(80.0)  # 280 s, the first normal point: too early


def test_recovery_points_do_not_teach_the_normal_band() -> None:
    detector = trained_detector()
    detector.start_recovery(200.0)
    for t, y in RECOVERY[:7]:
        detector.observe(t, 600.0, y)
    assert detector.normal.count == 20
    assert detector.normal.mean == pytest.approx(0.0)


def test_keeping_pace_with_a_backlog_that_stays_is_not_a_recovery() -> None:
    detector = trained_detector()
    detector.start_recovery(200.0)
    # Throughput matches the arrivals (lag rate in the band) but 80,000 records stay queued.
    for t in (240.0, 250.0, 260.0, 270.0, 280.0):
        assert detector.observe(t, 600.0, 600.0, backlog=80_000) is None
    assert detector.recovering
    for t, backlog in ((290.0, 70_000), (300.0, 5_000), (310.0, 4_000)):
        assert detector.observe(t, 600.0, 603.0 if backlog > 6_000 else 598.0, backlog=backlog) is None
    # Within 6,000 records (10 s of arrivals) between 290 s (70,000) and 300 s (5,000): linearly, at
    # 290 + 10 x 64,000 / 65,000 s.
    assert detector.observe(320.0, 600.0, 601.0, backlog=3_000) == pytest.approx(90.0 + 10 * 64 / 65)


def test_the_return_is_timed_between_window_ends() -> None:
    detector = trained_detector()
    detector.start_recovery(200.0)
    assert detector.observe(210.0, 600.0, 0.0, backlog=12_000) is None  # down: 6,000 beyond the tolerance
    assert detector.observe(220.0, 600.0, 1200.0, backlog=9_000) is None  # 3,000 beyond
    assert detector.observe(230.0, 600.0, 900.0, backlog=3_000) is None  # 3,000 within: crossed at 225 s
    assert detector.observe(240.0, 600.0, 600.0, backlog=2_000) is None
    assert detector.observe(250.0, 600.0, 600.0, backlog=2_000) == pytest.approx(25.0)


def test_a_job_at_capacity_with_a_small_backlog_is_back_to_normal() -> None:
    # Its lag rate swings far outside the band learned at lower load, but the backlog stays within
    # 10 s of arrivals: caught up (what the recovery prediction and the scale-down control call normal).
    detector = trained_detector()
    detector.start_recovery(200.0)
    results = [detector.observe(t, 600.0, y, backlog=b)
               for t, y, b in ((210.0, 0.0, 9_000), (220.0, 680.0, 4_000), (230.0, 540.0, 4_600),
                               (240.0, 660.0, 4_000))]
    assert results == [None, None, None, pytest.approx(16.0)]  # 9,000 -> 4,000 crosses 6,000 at 216 s


def test_a_first_point_within_the_tolerance_ends_at_its_time() -> None:
    detector = trained_detector(sustain=1)
    detector.start_recovery(200.0)
    assert detector.observe(210.0, 600.0, 500.0, backlog=1_000) == pytest.approx(10.0)  # no earlier point to time it by


def test_a_short_return_is_timed_from_the_moment_processing_resumed() -> None:
    # A scale-down: stopped at 200 s, resumed at 212.5 s with 7,500 records waiting (1,500 beyond 10 s of
    # 600 records/s); the first window end after it already finds the backlog within the tolerance.
    detector = trained_detector()
    detector.start_recovery(200.0)
    detector.resumed(212.5, 600.0, 7_500)
    assert detector.observe(220.0, 600.0, 700.0, backlog=4_500) is None  # 1,500 within: crossed at 216.25 s
    assert detector.observe(230.0, 600.0, 600.0, backlog=3_000) is None
    assert detector.observe(240.0, 600.0, 600.0, backlog=3_000) == pytest.approx(16.25)


def test_a_resumption_already_within_the_tolerance_is_the_return_and_one_after_a_point_says_nothing() -> None:
    detector = trained_detector(sustain=1)
    detector.start_recovery(200.0)
    detector.resumed(205.0, 600.0, 3_000)  # caught up as it resumed
    assert detector.observe(210.0, 600.0, 600.0, backlog=1_000) == pytest.approx(5.0)
    detector = trained_detector()
    detector.start_recovery(200.0)
    detector.resumed(190.0, 600.0, 9_000)  # before the stop: not this recovery's
    assert detector.observe(210.0, 600.0, 0.0, backlog=12_000) is None
    detector.resumed(215.0, 600.0, 1_000)  # a point was observed since the start: it times the return
    assert detector.observe(220.0, 600.0, 1200.0, backlog=9_000) is None
    assert detector.observe(230.0, 600.0, 900.0, backlog=3_000) is None
    assert detector.observe(240.0, 600.0, 600.0, backlog=2_000) is None
    assert detector.observe(250.0, 600.0, 600.0, backlog=2_000) == pytest.approx(25.0)


def test_fallback_before_enough_normal_samples_uses_the_backlog() -> None:
    detector = RecoveryDetector(min_normal_samples=10, backlog_tolerance_s=10.0)
    for i in range(3):
        detector.observe(i * 10.0, 600.0, 600.0, backlog=1000)
    assert detector.judge == "fallback"
    detector.start_recovery(50.0)
    assert detector.observe(60.0, 600.0, 1000.0, backlog=50_000) is None  # over 6000 = 10 s of arrivals
    assert detector.observe(70.0, 600.0, 1000.0, backlog=8_000) is None
    assert detector.observe(80.0, 600.0, 700.0, backlog=5_000) is None
    assert detector.observe(90.0, 600.0, 600.0, backlog=4_000) is None
    # Within 6,000 between 70 s (8,000) and 80 s (5,000): at 70 + 10 x 2 / 3 s.
    assert detector.observe(100.0, 600.0, 600.0, backlog=4_000) == pytest.approx(20.0 + 10 * 2 / 3)


def test_detector_survives_serialization_mid_recovery() -> None:
    detector = trained_detector()
    detector.start_recovery(200.0)
    for t, y in RECOVERY[:9]:
        detector.observe(t, 600.0, y)
    restored = RecoveryDetector.from_dict(json.loads(json.dumps(detector.to_dict())))
    assert restored == detector
    results = [restored.observe(t, 600.0, y) for t, y in RECOVERY[9:]]
    assert results[-1] == pytest.approx(110.0)

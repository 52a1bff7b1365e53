"""Production controls around DS2: each scenario goes wrong without its control."""

from __future__ import annotations

import calendar
from datetime import datetime
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.analyses import Analysis
from contracts.decisions import Action
from contracts.jobs import ConfigError, JobConfig, parse_assignments, validate_overrides
from contracts.periods import PeriodError, excluded_at, parse_periods
from contracts.plan_state import Downtimes, PlanState, expected_restart_time
from contracts.settings import Settings
from plan.controls import align, even_parallelism, limit_step
from plan.ds2 import plan_ds2
from plan.gates import with_quota
from plan.kernel import decide
from plan.policies.reactive import ReactivePolicy
from plan.policy import Plan
from tests.unit.test_ds2 import analysis

# Every control that is not under test is neutral: no band, no delay, no restart cost, no waiting.
NEUTRAL: dict[str, Any] = {
    "target_utilization": 0.7, "utilization_band": 0.0, "restart_time_s": 0, "scale_down_delay_s": 0,
    "stabilization_windows": 0, "ineffective_scale_up_threshold": 0, "min_samples": 1, "metrics_window_s": 0,
}


def config(**overrides: Any) -> JobConfig:
    return JobConfig.model_validate(NEUTRAL | overrides)


class Loop:
    """Feeds windows to the planner step with the default policy, as the plan agent does, keeping
    the plan state; `restart_time_s` is a restart execute measured before."""

    def __init__(self, job_config: JobConfig, restart_time_s: float | None = None):
        self.config = job_config
        self.state = PlanState(downtimes=Downtimes(up=[] if restart_time_s is None else [restart_time_s]))
        self.plans: list[Plan] = []

    def window(self, rescaling: bool = False, **fields: Any) -> Plan:
        self.state, plan = decide(self.state.model_copy(update={"rescaling": rescaling}), analysis(**fields),
                                  self.config, ReactivePolicy())
        self.plans.append(plan)
        return plan


# ---------------------------------------------------------------- 1. catch-up with restart time


def test_a_rescale_is_sized_to_drain_what_arrives_while_the_job_restarts() -> None:
    # 350 rec/s, 100 rec/s per slot: 5 slots without restart cost. A 120 s restart adds
    # 350 x 120 = 42,000 records to drain in 300 s: (350 + 140) / 70 -> 7 slots.
    assert plan_ds2(analysis(), config()).to_parallelism == 5
    plan = plan_ds2(analysis(), config(), restart_time_s=120)
    assert plan.to_parallelism == 7
    assert plan.reason.numbers["target_rate"] == pytest.approx(490.0)


def test_staying_put_costs_no_restart_and_a_scale_down_must_pay_for_its_restart() -> None:
    # At 5 slots the job carries 350 rec/s at 70%: optimal as it is, however long a restart takes.
    assert plan_ds2(analysis(parallelism=5), config(), restart_time_s=600).action is Action.NONE
    # 280 rec/s want 4 slots; with a 120 s restart to drain the smaller job needs 280 x 1.4 / 70 = 5.6 -> 6 >= 5.
    held = plan_ds2(analysis(parallelism=5, arrival_rate=280.0), config(), restart_time_s=120)
    assert held.action is Action.NONE and held.reason.code == "at_optimal"
    assert plan_ds2(analysis(parallelism=5, arrival_rate=280.0), config()).to_parallelism == 4


def test_restart_time_is_learned_from_measured_downtimes_capped_with_a_default_until_then() -> None:
    assert expected_restart_time([], default_s=60, cap_s=600) == 60
    assert expected_restart_time([12.0, 31.5, 20.0], default_s=60, cap_s=600) == 31.5
    assert expected_restart_time([900.0], default_s=60, cap_s=300) == 300
    # The plan uses the learned time: 31.5 s instead of the 60 s default.
    loop = Loop(config(restart_time_s=60), restart_time_s=31.5)
    assert loop.window().reason.numbers["restart_time_s"] == 31.5


# ---------------------------------------------------------------- 2. hysteresis


def test_no_action_inside_the_utilization_band_and_action_outside_it() -> None:
    # 5 slots x 100 rec/s; 380 rec/s is 76% implied: inside 70% +- 10%, outside 70% +- 5%.
    inside = Loop(config(utilization_band=0.1)).window(parallelism=5, arrival_rate=380.0)
    assert inside.action is Action.NONE and inside.reason.code == "within_utilization_band"
    assert inside.recommended == 6
    outside = Loop(config(utilization_band=0.05)).window(parallelism=5, arrival_rate=380.0)
    assert outside.action is Action.SCALE_UP and outside.to_parallelism == 6


# ---------------------------------------------------------------- 4. delayed scale-down


def test_a_scale_down_waits_for_the_delay_then_takes_the_largest_recommendation_during_it() -> None:
    loop = Loop(config(scale_down_delay_s=60))
    # At 8 slots the load asks for 3, then 5, then 4 slots.
    first = loop.window(parallelism=8, window_end=1000.0, arrival_rate=210.0)
    assert first.reason.code == "scale_down_delayed" and first.action is Action.NONE
    assert loop.window(parallelism=8, window_end=1030.0, arrival_rate=350.0).reason.code == "scale_down_delayed"
    done = loop.window(parallelism=8, window_end=1060.0, arrival_rate=280.0)
    assert done.action is Action.SCALE_DOWN and done.to_parallelism == 5
    # Without the delay it would have gone to 3 at once, and back up soon after.
    assert Loop(config()).window(parallelism=8, arrival_rate=210.0).to_parallelism == 3


def test_a_window_that_does_not_ask_for_a_scale_down_cancels_the_pending_one() -> None:
    loop = Loop(config(scale_down_delay_s=60))
    loop.window(parallelism=8, window_end=1000.0, arrival_rate=210.0)
    assert loop.window(parallelism=8, window_end=1030.0, arrival_rate=560.0).reason.code == "at_optimal"
    # The delay starts again: 60 s after the cancellation it is still pending.
    assert loop.window(parallelism=8, window_end=1040.0, arrival_rate=210.0).reason.code == "scale_down_delayed"
    assert loop.window(parallelism=8, window_end=1090.0, arrival_rate=210.0).reason.code == "scale_down_delayed"
    assert loop.window(parallelism=8, window_end=1100.0, arrival_rate=210.0).action is Action.SCALE_DOWN


def test_a_scale_up_is_never_delayed() -> None:
    loop = Loop(config(scale_down_delay_s=600))
    assert loop.window(parallelism=2, arrival_rate=350.0).action is Action.SCALE_UP


# ---------------------------------------------------------------- 5. stabilization and minimum samples


def test_no_decision_before_the_minimum_number_of_samples_at_a_parallelism() -> None:
    loop = Loop(config(stabilization_windows=1, min_samples=3))
    codes = [loop.window().reason.code for _ in range(4)]
    assert codes == ["stabilizing", "collecting_samples", "collecting_samples", "ds2_optimal"]
    # Invalid windows are not samples.
    loop = Loop(config(min_samples=2))
    assert loop.window(valid=False, invalid_reason="no records").reason.code == "invalid_window"
    assert loop.window().reason.code == "collecting_samples"
    assert loop.window().reason.code == "ds2_optimal"


# ---------------------------------------------------------------- 6. bounds and step factors


def test_step_factors_bound_one_step() -> None:
    assert limit_step(2, 20, config(max_scale_up_factor=1.0))[0] == 4
    assert limit_step(10, 2, config(max_scale_down_factor=0.5))[0] == 5
    assert limit_step(10, 2, config())[0] == 2
    # A factor never blocks a step of one.
    assert limit_step(1, 3, config(max_scale_up_factor=0.1))[0] == 2
    plan = Loop(config(max_scale_up_factor=1.0)).window(parallelism=1)
    assert plan.to_parallelism == 2 and "max_scale_up_factor" in plan.reason.message


def test_min_and_max_parallelism_bound_the_decision() -> None:
    assert Loop(config(max_parallelism=3)).window().to_parallelism == 3
    assert Loop(config(min_parallelism=4)).window(parallelism=6, arrival_rate=70.0).to_parallelism == 4


# ---------------------------------------------------------------- 7. partition alignment


def test_parallelism_is_aligned_to_spread_unsplittable_partitions_evenly() -> None:
    # 12 partitions: 5 tasks run 3 rounds like 4 do; 6 is the smallest even spread above 5.
    assert even_parallelism(12, 5, upper=32) == 6
    assert even_parallelism(12, 4, upper=32) == 4
    assert even_parallelism(12, 7, upper=32) == 12
    assert even_parallelism(12, 7, upper=10) is None
    plan = Loop(config()).window(partitions=12, splittable=False)  # DS2 says 5
    assert plan.to_parallelism == 6 and "aligned 5 -> 6" in plan.reason.message
    # A splittable source needs no alignment.
    assert Loop(config()).window(partitions=12, splittable=True).to_parallelism == 5


def test_alignment_never_reverses_the_scaling_direction() -> None:
    # Down from 6 to 5: aligning would round back up to 6, so the step stays unaligned.
    assert align(current=6, to=5, units=12, lower=1, upper=32) == 5
    assert align(current=12, to=5, units=12, lower=1, upper=32) == 6
    plan = Loop(config()).window(parallelism=12, partitions=12, splittable=False, arrival_rate=350.0)
    assert plan.action is Action.SCALE_DOWN and plan.to_parallelism == 6


def test_shuffle_partitions_are_aligned_too() -> None:
    # DS2 says 5; 16 shuffle tasks over 5 slots leave one with 4 (the capacity of 4 slots), over 6
    # the busiest has 3 (the capacity of 5.3 slots).
    plan = Loop(config()).window(shuffle_partitions=16)
    assert plan.to_parallelism == 6


# ---------------------------------------------------------------- 8. ineffective scale-up


def test_an_ineffective_scale_up_is_judged_on_several_windows_then_blocks_further_ones_with_back_off() -> None:
    loop = Loop(config(ineffective_scale_up_threshold=0.1, ineffective_block_s=600))
    up = loop.window(parallelism=2, window_end=1000.0)
    assert up.action is Action.SCALE_UP and up.to_parallelism == 5
    # At 5 slots the job processes no more than at 2 (an external bottleneck): about 40 rec/s per slot.
    for t, rate in ((1060.0, 44.0), (1070.0, 38.0)):
        judging = loop.window(parallelism=5, window_end=t, true_processing_rate=rate)
        assert judging.notices == [] and judging.reason.code == "judging_scale_up"
    blocked = loop.window(parallelism=5, window_end=1080.0, true_processing_rate=40.0)
    assert [n.code for n in blocked.notices] == ["ineffective_scale_up"]
    assert blocked.notices[0].numbers["blocked_s"] == 300  # the first block
    assert blocked.action is Action.NONE and blocked.reason.code == "scale_up_blocked"
    assert loop.window(parallelism=5, window_end=1090.0, true_processing_rate=40.0).notices == []
    # A backlog heading beyond its target lifts the block; scale-downs stay allowed.
    heading = loop.window(parallelism=5, window_end=1100.0, true_processing_rate=40.0, backlog=30_000,
                          backlog_growth_rate=150.0)
    assert heading.action is Action.SCALE_UP
    assert loop.window(parallelism=5, window_end=1110.0, arrival_rate=70.0, true_processing_rate=40.0).action \
        is Action.SCALE_DOWN
    # After the block, scale-ups are allowed again; a second ineffective one in a row blocks twice as long.
    again = loop.window(parallelism=5, window_end=1400.0, true_processing_rate=40.0)
    assert again.action is Action.SCALE_UP and again.to_parallelism == 13
    for t in (1460.0, 1470.0):
        loop.window(parallelism=13, window_end=t, true_processing_rate=16.0)
    second = loop.window(parallelism=13, window_end=1480.0, true_processing_rate=15.0)
    assert [n.code for n in second.notices] == ["ineffective_scale_up"]
    assert second.notices[0].numbers["blocked_s"] == 600


def test_one_slow_window_does_not_make_a_scale_up_ineffective() -> None:
    loop = Loop(config(ineffective_scale_up_threshold=0.1))
    loop.window(parallelism=2, window_end=1000.0)
    rates = (45.0, 95.0, 100.0)  # a GC pause in the first window at the new parallelism
    plans = [loop.window(parallelism=5, window_end=1060.0 + 10 * i, true_processing_rate=r, arrival_rate=600.0)
             for i, r in enumerate(rates)]
    assert all(not p.notices for p in plans)
    assert plans[-1].action is Action.SCALE_UP


def test_an_effective_scale_up_is_not_blocked() -> None:
    loop = Loop(config(ineffective_scale_up_threshold=0.1))
    loop.window(parallelism=2, window_end=1000.0)
    for t in (1060.0, 1070.0):
        loop.window(parallelism=5, window_end=t, true_processing_rate=95.0, arrival_rate=600.0)
    after = loop.window(parallelism=5, window_end=1080.0, true_processing_rate=95.0, arrival_rate=600.0)
    assert after.notices == [] and after.action is Action.SCALE_UP


# ---------------------------------------------------------------- 9. excluded periods and quota


def at(text: str) -> float:
    return float(calendar.timegm(datetime.fromisoformat(text).timetuple()))


def test_excluded_periods_parse_and_match() -> None:
    periods = parse_periods("22:00-06:00; Sat,Sun 12:00-13:00; 2026-12-24T00:00/2026-12-27T00:00")
    assert excluded_at(at("2026-11-18T23:30:00"), periods) is not None  # Wednesday night
    assert excluded_at(at("2026-11-19T05:59:00"), periods) is not None  # wraps past midnight
    assert excluded_at(at("2026-11-19T06:00:00"), periods) is None
    assert excluded_at(at("2026-11-21T12:30:00"), periods) is not None  # Saturday
    assert excluded_at(at("2026-11-20T12:30:00"), periods) is None  # Friday
    assert excluded_at(at("2026-12-25T12:00:00"), periods) is not None
    weekdays = parse_periods("Mon-Fri 09:00-10:00")
    assert excluded_at(at("2026-11-23T09:30:00"), weekdays) is not None  # Monday
    assert excluded_at(at("2026-11-22T09:30:00"), weekdays) is None  # Sunday
    for bad in ("25:00-06:00", "Someday 01:00-02:00", "10:00-10:00", "2026-12-27/2026-12-24", "soon"):
        with pytest.raises(PeriodError):
            parse_periods(bad)


def test_no_rescale_inside_an_excluded_period() -> None:
    loop = Loop(config(excluded_periods="09:00-10:00"))
    held = loop.window(window_end=at("2026-11-20T09:30:00"))
    assert held.action is Action.NONE and held.reason.code == "excluded_period" and held.recommended == 5
    assert loop.window(window_end=at("2026-11-20T10:30:00")).action is Action.SCALE_UP


def test_the_quota_trims_a_scale_up_and_holds_when_nothing_is_left() -> None:
    plan = Loop(config()).window(parallelism=2)  # wants 5
    _, trimmed = with_quota(PlanState(), plan, current=2, granted=4, quota=10)
    assert trimmed.action is Action.SCALE_UP and trimmed.to_parallelism == 4
    assert [notice.code for notice in trimmed.notices] == ["quota_bound"]
    _, held = with_quota(PlanState(), plan, current=2, granted=2, quota=10)
    assert held.action is Action.NONE and held.reason.code == "quota_exhausted" and held.notices
    assert with_quota(PlanState(), plan, current=2, granted=5, quota=10) == (PlanState(), plan)


# ---------------------------------------------------------------- 10. modes and configuration


def test_invalid_configuration_is_refused_with_a_clear_message() -> None:
    settings_ = Settings()
    with pytest.raises(ConfigError, match="unknown setting 'target'"):
        parse_assignments(["target=0.5"])
    with pytest.raises(ConfigError, match="target_utilization"):
        validate_overrides(settings_, {}, {"target_utilization": "1.5"})
    with pytest.raises(ConfigError, match=r"min_parallelism \(8\) exceeds max_parallelism"):
        validate_overrides(settings_, {"max_parallelism": "4"}, {"min_parallelism": "8"})
    with pytest.raises(ConfigError, match="excluded_periods"):
        validate_overrides(settings_, {}, {"excluded_periods": "noon"})
    assert validate_overrides(settings_, {}, {"mode": "recommend"}).mode.value == "recommend"


# ---------------------------------------------------------------- noisy steady load


def noisy_steady_windows(seed: int, minutes: int = 30, noise: float = 0.05) -> list[Analysis]:
    """Arrivals of 1,400 rec/s at 8 slots of 250 rec/s (70%), every rate jittered by `noise` (sd)."""
    rng = np.random.default_rng(seed)
    windows = []
    for i in range(minutes * 6):
        arrival = 1400.0 * (1 + rng.normal(0, noise))
        per_slot = 250.0 * (1 + rng.normal(0, noise))
        windows.append(analysis(
            window_end=1000.0 + 10 * i, parallelism=8, arrival_rate=arrival, true_processing_rate=per_slot,
            true_output_rate=per_slot, utilization=min(1.0, arrival / (8 * per_slot)),
            backlog=int(abs(rng.normal(0, 0.5)) * arrival),
        ))
    return windows


def actions(windows: list[Analysis], job_config: JobConfig) -> int:
    state = PlanState()
    count = 0
    for window in windows:
        state, plan = decide(state, window, job_config, ReactivePolicy())
        count += plan.action is not Action.NONE
    return count


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1))
def test_noisy_steady_load_for_30_minutes_leads_to_no_scaling_action(seed: int) -> None:
    assert actions(noisy_steady_windows(seed), JobConfig()) == 0


def test_without_band_delay_and_averaging_the_same_noise_churns() -> None:
    assert actions(noisy_steady_windows(7), config()) > 10


def test_a_backlog_heads_beyond_its_target_by_the_arrivals_beyond_capacity_when_its_growth_is_not_measured() -> None:
    """One report in a window (a micro-batch longer than the report interval) measures no growth: the
    arrivals beyond the slots' true rate still say where the backlog goes."""
    from plan.controls import heading_beyond_target

    config = JobConfig(backlog_target_s=20.0)

    def window(growth: float, arrival: float, per_slot: float = 200.0) -> Analysis:
        return Analysis(job_id="j", window_end=50.0, parallelism=1, valid=True, true_processing_rate=per_slot,
                        true_output_rate=per_slot, observed_processing_rate=per_slot, utilization=1.0,
                        arrival_rate=arrival, backlog=4_500, backlog_growth_rate=growth, closed_at=50.0)

    assert heading_beyond_target(window(0.0, 400.0), config)  # 4,500 + 200 x 20 > 20 x 400
    assert heading_beyond_target(window(300.0, 400.0, per_slot=400.0), config)  # the measured growth counts
    assert not heading_beyond_target(window(0.0, 400.0, per_slot=400.0), config)  # it keeps up: 4,500 < 8,000
    assert not heading_beyond_target(window(-50.0, 400.0, per_slot=350.0), config)  # 4,500 + 50 x 20 < 8,000

"""The proactive wiring's pure parts: per-worker loads, what analyze learns per window, the
daedalus/hybrid policies inside the controls, and the recovered finding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.forecast import ForecastState, abandon_retrain
from analyze.learning import Learned, learn, new_learned, scaling_curve
from analyze.true_rates import analyze_window
from contracts.analyses import Analysis, CapacityView, ForecastView, RecoveryView
from contracts.decisions import Action
from contracts.jobs import JobConfig
from contracts.messages import MetricWindow, SourceWindow
from contracts.plan_state import Downtimes, PendingRecovery, PlanState
from knowledge import stored_forms
from plan.kernel import decide
from plan.policies.daedalus import DaedalusPolicy
from plan.policies.hybrid import HybridPolicy
from plan.policies.reactive import ReactivePolicy
from plan.policy import Plan
from plan.proactive import plan_proactive, predicted_recovery_s, recovery_notice, regression_capacity
from plan.registry import policy_class
from tests.unit.test_ds2 import analysis
from tests.unit.test_monitor import fold, report


def window(end: float, parallelism: int, arrival: float, throughput: float, backlog: int,
           utilization: float, step: float = 10.0) -> MetricWindow:
    """A one-worker window: `throughput` rec/s at `utilization` busy fraction of `parallelism` slots."""
    return MetricWindow.model_validate({
        "job_id": "job", "window_start": end - step, "window_end": end, "observed_s": step, "report_count": 1,
        "workers": 1, "parallelism": parallelism, "parallelism_changed": False,
        "records_in": round(throughput * step), "records_out": round(throughput * step),
        "busy_time_s": utilization * step * parallelism,
        "source": SourceWindow(arrival_rate=arrival, backlog=backlog, backlog_growth_rate=0.0, partitions=8,
                               splittable=True),
        "worker_loads": [{"worker_id": "driver", "throughput": throughput, "utilization": utilization,
                          "utilization_source": "busy"}],
    })


def feed(learned: Learned, w: MetricWindow) -> tuple[Learned, CapacityView, RecoveryView | None]:
    return learn(learned, w, analyze_window(w, None))


# ---------------------------------------------------------------- monitor: per-worker loads


def test_each_worker_reports_its_busy_fraction_of_an_even_share_of_the_slots() -> None:
    reports = [
        report(101.0, worker_id="a", parallelism=4, records_in=300, busy_time_s=1.0, interval_s=1.0),
        report(101.0, worker_id="b", parallelism=4, records_in=100, busy_time_s=0.5, interval_s=1.0),
    ]
    _, windows = fold([*reports, report(200.0, parallelism=4)])
    loads = {w.worker_id: w for w in windows[0].worker_loads}
    # Two workers share 4 slots: 2 slots each, so 1 busy second in 1 s is 50 %.
    assert loads["a"].utilization == pytest.approx(0.5) and loads["a"].throughput == pytest.approx(300)
    assert loads["b"].utilization == pytest.approx(0.25) and loads["b"].utilization_source == "busy"


def test_cpu_utilization_is_the_fallback_when_no_busy_time_is_reported() -> None:
    _, windows = fold([report(101.0, busy_time_s=0.0, cpu_utilization=0.4, records_in=50, interval_s=1.0),
                       report(200.0)])
    load = windows[0].worker_loads[0]
    assert load.utilization_source == "cpu" and load.utilization == pytest.approx(0.4)


# ---------------------------------------------------------------- analyze: capacity and recovery


def test_the_capacity_model_learns_from_settled_windows_and_extrapolates_to_saturation() -> None:
    learned = new_learned()
    # 200 rec/s per fully busy slot plus a fixed 5 % overhead: throughput = 200 (u - 0.05) / 0.95 x p.
    loads = [0.3, 0.5, 0.7, 0.4, 0.6] * 3
    for i, u in enumerate(loads):
        learned, view, _ = feed(learned, window(10.0 * (i + 1), 2, 0.0, 400 * (u - 0.05) / 0.95, 0, u))
        if i == 2:
            # Until the regression has 3 samples (windows 2 and 3) a window's capacity is throughput / utilization,
            # which misses the overhead: below the true 400 rec/s.
            assert learned.capacity.estimate(2).value < 385
    # The first window at a parallelism is skipped (it includes the start), the others are fitted; the
    # decaying average forgets the early ratio estimates.
    assert learned.capacity.estimate(2).value == pytest.approx(400, rel=0.01)
    assert view.regression_samples == len(loads) - 1 and view.observed == {"2": pytest.approx(400, rel=0.01)}
    # Busy time is reported, so the hybrid choice is DS2's true rate.
    assert view.source == "ds2"


def test_learned_state_survives_serialisation_unchanged() -> None:
    learned = new_learned(anomaly_k=2.0)
    for i in range(5):
        learned, _, _ = feed(learned, window(10.0 * (i + 1), 2, 300.0, 300.0, 0, 0.5 + 0.05 * i))
    again = Learned.from_dict(learned.to_dict())
    assert again.to_dict() == learned.to_dict()
    assert again.detector.k == 2.0 and again.capacity.observed == learned.capacity.observed


def test_a_rescale_starts_a_recovery_that_ends_when_the_backlog_is_back_within_tolerance() -> None:
    learned = new_learned()
    t = 0.0
    for i in range(12):  # normal: throughput follows arrivals (+-5 rec/s)
        t += 10
        learned, _, recovery = feed(learned, window(t, 2, 300.0, 300.0 + (5 if i % 2 else -5), 100, 0.75))
        assert recovery is None
    stopped = t
    # Down for 30 s (no windows), then catching up at 4 slots, then back to normal.
    t += 30
    observed = []
    for throughput, backlog in [(700, 9000), (700, 5000), (700, 1000), (305, 100), (295, 80), (300, 90)]:
        t += 10
        learned, _, recovery = feed(learned, window(t, 4, 300.0, throughput, backlog, 0.5))
        observed.append(recovery)
    recovery = observed[4]
    assert observed[:4] == [None] * 4 and recovery is not None and observed[5] is None
    # The backlog came within 10 s of arrivals (3,000) between the second and third windows after the
    # restart (5,000 -> 1,000: half-way), and stayed there for three windows.
    assert recovery.started_at == stopped
    assert recovery.observed_s == pytest.approx(30 + 20 + 5)
    assert (recovery.from_parallelism, recovery.to_parallelism, recovery.judge) == (2, 4, "backlog")


def test_a_short_recovery_is_timed_from_when_the_restarted_job_resumed() -> None:
    learned = new_learned()
    t = 0.0
    for i in range(12):
        t += 10
        learned, _, _ = feed(learned, window(t, 2, 300.0, 300.0 + (5 if i % 2 else -5), 200, 0.75))
    stopped = t
    # Down 12.5 s: the first window at 1 slot has reports for its last 7.5 s; 200 + 12.5 s x 300 = 3,950
    # records waited when it resumed (950 beyond 10 s of arrivals); its end finds 1,000 (2,000 within).
    resumed = window(t + 20, 1, 300.0, 420.0, 1000, 0.9).model_copy(update={"observed_s": 7.5})
    learned, _, recovery = feed(learned, resumed)
    assert recovery is None
    for throughput, backlog in [(300, 900), (300, 950)]:
        learned, _, recovery = feed(learned, window(learned.last_window_end + 10, 1, 300.0, throughput, backlog, 0.9))
    assert recovery is not None and recovery.started_at == stopped
    # The excess crossed zero 950 / (950 + 2,000) of the way from the resumption to the window's end.
    assert recovery.observed_s == pytest.approx(12.5 + 7.5 * 950 / 2950)
    # What an earlier version stored (no last backlog, report time or detector point) reads as none.
    older = {k: v for k, v in learned.to_dict().items() if k not in ("last_backlog", "last_report_at")}
    older["detector"] = {k: v for k, v in older["detector"].items() if k != "last_excess"}
    again = Learned.from_dict(stored_forms.learned(older))
    assert again.last_backlog is None and again.last_report_at is None and again.detector.last_excess is None


def test_a_restart_is_timed_from_its_reports_not_from_the_window_grid() -> None:
    """The stop is the end of the old job's last report (the reporter publishes one as the query
    stops) and the resumption the start of the new job's first: a window grid of 10 s would put the
    stop at 1110, after the restarted job resumed (1109), and time the return at a window's end."""
    def at(ts: float, parallelism: int, backlog: int, interval_s: float = 5.0) -> Any:
        return report(ts, parallelism=parallelism, interval_s=interval_s, records_in=round(300 * interval_s),
                      busy_time_s=0.5 * interval_s, source={"arrival_rate": 300.0, "backlog": backlog, "partitions": 4})

    reports = [at(1005.0 + 5 * i, 2, 200) for i in range(20)] + [at(1103.0, 2, 200, 3.0)]
    reports += [at(1114.5, 1, 900, 5.5)] + [at(1119.5 + 5 * i, 1, 800) for i in range(8)]
    _, windows = fold(reports)
    learned, recoveries = new_learned(), []
    for w in windows:
        learned, _, recovery = feed(learned, w)
        recoveries.append(recovery)
    first = next(w for w in windows if w.parallelism == 1)
    assert (first.first_report_at, first.stopped_at) == (1109.0, None)
    done = [r for r in recoveries if r is not None]
    assert len(done) == 1 and done[0].started_at == 1103.0
    # 200 + 6 s x 300 waited at the resumption, within 10 s of arrivals: back to normal then.
    assert done[0].observed_s == pytest.approx(6.0)


def test_a_window_spanning_a_rescale_says_when_the_old_job_stopped_and_the_new_one_resumed() -> None:
    reports = [report(1001.0, parallelism=2), report(1003.0, parallelism=2, interval_s=2.0),
               report(1008.0, parallelism=3, interval_s=2.5), report(1009.0, parallelism=3), report(1011.0)]
    _, (w,) = fold(reports)
    assert (w.parallelism, w.parallelism_changed) == (3, True)
    assert (w.stopped_at, w.first_report_at, w.last_report_at) == (1003.0, 1005.5, 1009.0)


# ---------------------------------------------------------------- plan: daedalus and hybrid


def proactive_analysis(forecast: list[float], observed: dict[str, float], **fields: Any) -> Analysis:
    return analysis(**{
        "parallelism": 2, "arrival_rate": forecast[0], "backlog": 0,
        "capacity": CapacityView(observed=observed, current=observed.get("2"), source="regression",
                                 curve=scaling_curve(observed)),
        "forecast": ForecastView(values=forecast, start=110.0, step_s=10.0, method="arima"),
    } | fields)


def proactive(a: Analysis, config: JobConfig, since_last_rescale_s: float | None = None,
              policy: DaedalusPolicy | None = None) -> tuple[Plan | None, str]:
    """Daedalus's choice (or hybrid's, with `policy`) for the analysis, nothing measured yet."""
    chosen = policy or DaedalusPolicy()
    return plan_proactive(a, config, Downtimes(), since_last_rescale_s, chosen.capacity(a), chosen.name)


def cfg(**overrides: Any) -> JobConfig:
    base = {"policy": "daedalus", "utilization_band": 0.0, "restart_time_s": 20, "scale_down_delay_s": 0,
            "stabilization_windows": 0, "ineffective_scale_up_threshold": 0, "min_samples": 1,
            "metrics_window_s": 0, "checkpoint_interval_s": 0, "max_parallelism": 16}
    return JobConfig.model_validate(base | overrides)


def test_daedalus_scales_out_before_a_forecast_rise_reaches_the_current_capacity() -> None:
    # 200 rec/s per slot (power law through 1 and 2 slots), the arrival rate ramps 300 -> 900 rec/s.
    ramp = [300.0 + 600.0 * i / 89 for i in range(90)]
    plan, why = proactive(proactive_analysis(ramp, {"1": 200.0, "2": 400.0}), cfg())
    assert plan is not None, why
    # Now 2 slots (400 rec/s) keep up, but the forecast peak needs 5 (1000 rec/s > 900).
    assert plan.action is Action.SCALE_UP and plan.to_parallelism == 5
    assert plan.reason.code == "daedalus_smallest_sufficient" and plan.reason.rule == "daedalus"


def test_daedalus_holds_a_recent_rescale_that_still_carries_the_load() -> None:
    flat = [300.0] * 90
    plan, _ = proactive(proactive_analysis(flat, {"2": 400.0}), cfg(), since_last_rescale_s=30)
    assert plan is not None and plan.action is Action.NONE and plan.reason.code == "daedalus_recent_rescale_holds"


def test_hybrid_uses_ds2_true_rates_when_busy_time_is_reported() -> None:
    flat = [300.0] * 90
    a = proactive_analysis(flat, {"2": 1000.0}, true_processing_rate=100.0)
    a = a.model_copy(update={"capacity": a.capacity.model_copy(update={"source": "ds2"})})
    daedalus, _ = proactive(a, cfg())
    hybrid, _ = proactive(a, cfg(policy="hybrid"), policy=HybridPolicy())
    assert daedalus is not None and hybrid is not None
    # The regression says 2 slots carry 1000 rec/s (scale in to 1); DS2 says 100 per slot: 4 slots.
    assert daedalus.to_parallelism == 1 and hybrid.to_parallelism == 4


def test_without_a_forecast_or_capacity_a_proactive_policy_falls_back_to_ds2_and_says_so() -> None:
    a = analysis(arrival_rate=350.0)  # no forecast, no capacity
    plan, why = proactive(a, cfg())
    assert plan is None and "forecast" in why
    _, guarded = decide(PlanState(), a, cfg(restart_time_s=0), DaedalusPolicy())
    assert guarded.to_parallelism == 5 and "daedalus cannot decide yet" in guarded.reason.message


def test_every_rescale_carries_its_predicted_recovery_and_the_recovery_is_compared() -> None:
    ramp = [300.0 + 600.0 * i / 89 for i in range(90)]
    state, plan = decide(PlanState(), proactive_analysis(ramp, {"1": 200.0, "2": 400.0}), cfg(), DaedalusPolicy())
    predicted = plan.reason.numbers["predicted_recovery_s"]
    assert plan.action is Action.SCALE_UP and predicted is not None and predicted > 20  # downtime included
    assert state.pending_recovery is not None and state.pending_recovery.to == plan.to_parallelism
    observed = RecoveryView(started_at=100.0, observed_s=predicted + 7, judge="statistical", from_parallelism=2,
                            to_parallelism=plan.to_parallelism)
    notice = recovery_notice(observed, state.pending_recovery)
    assert notice.code == "recovered" and notice.numbers["error_s"] == pytest.approx(7, abs=0.01)
    # A recovery from another rescale than the predicted one is not compared.
    other = observed.model_copy(update={"to_parallelism": 3})
    assert recovery_notice(other, state.pending_recovery).numbers["predicted_s"] is None


def test_an_observed_recovery_counts_from_the_stop_once_execute_recorded_the_restart() -> None:
    pending = PendingRecovery.model_validate({"from": 4, "to": 2, "predicted_s": 26.0, "window_end": 260.0})
    # The job stopped at 264 s, after the window ending at 260 s; the window ending at 270 s still held
    # reports from before the stop, so the detector counts from 270 s. The restart took 17 s.
    state = PlanState(pending_recovery=pending).after_rescale(2, 281.0, 17.0, "down")
    seen = RecoveryView(started_at=270.0, observed_s=20.0, judge="backlog", from_parallelism=4, to_parallelism=2)
    numbers = recovery_notice(seen, pending, state).numbers
    assert (numbers["observed_s"], numbers["detected_s"], numbers["stopped_at"]) == (26.0, 20.0, 264.0)
    assert numbers["error_s"] == 0.0
    # Back to normal is never before the restart ended.
    early = seen.model_copy(update={"observed_s": 5.0})
    assert recovery_notice(early, pending, state).numbers["observed_s"] == 17.0
    # Without the restart recorded, the detector's figure stands.
    assert recovery_notice(seen, pending, PlanState(pending_recovery=pending)).numbers["observed_s"] == 20.0


def test_ds2_rescales_are_predicted_with_ds2_capacity_and_a_flat_forecast() -> None:
    # 5 slots x 100 rec/s = 500 rec/s, 150 spare over 350 arriving; 20 s down: 7,000 records, over
    # once 10 s of arrivals (3,500, the detector's tolerance) are left -> 20 + 23.3 s.
    a, ds2 = analysis(), ReactivePolicy()
    value = predicted_recovery_s(a, cfg(policy="default"), 5, Downtimes(), ds2.capacity_of(a, cfg()))
    assert value == pytest.approx(20 + (350 * 20 - 3500) / 150, rel=1e-6)
    no_tolerance = cfg(policy="default", backlog_tolerance_s=0)
    assert predicted_recovery_s(a, no_tolerance, 5, Downtimes(), ds2.capacity_of(a, no_tolerance)) == pytest.approx(
        20 + 350 * 20 / 150, rel=1e-6)
    # The job stops between micro-batches: nothing is replayed, whatever the worst case the planner keeps.
    checkpointed = cfg(policy="default", checkpoint_interval_s=10)
    assert predicted_recovery_s(a, checkpointed, 5, Downtimes(), ds2.capacity_of(a, checkpointed)) == pytest.approx(
        value, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(1, 64), st.floats(1.0, 1e6), min_size=1, max_size=6), st.integers(1, 128))
def test_regression_capacity_returns_what_was_observed_and_is_positive_elsewhere(
    observed: dict[int, float], p: int
) -> None:
    points = {str(k): v for k, v in sorted(observed.items())}
    capacity_of = regression_capacity(CapacityView(observed=points, curve=scaling_curve(points)))
    assert capacity_of is not None
    value = capacity_of(p)
    assert value == observed[p] if p in observed else value > 0


def test_a_refit_lost_with_its_worker_is_requested_again() -> None:
    state = ForecastState(retrain_outstanding=True, retrain_id=3)
    again = abandon_retrain(state)
    assert not again.retrain_outstanding and again.retrain_id == 3
    assert policy_class("hybrid").needs_forecast and not policy_class("reactive").needs_forecast


def test_a_late_recovery_of_the_rescale_before_keeps_the_next_rescales_prediction() -> None:
    # 1 -> 3 was recovering when 3 -> 1 was decided; the window that ends the 1 -> 3 recovery closes after
    # that: the prediction of 3 -> 1 must still be there when its own recovery is seen.
    pending = PendingRecovery.model_validate({"from": 3, "to": 1, "predicted_s": 13.0, "window_end": 188.0})
    state = PlanState(parallelism=1, pending_recovery=pending).after_rescale(1, 203.0, 10.0, "down")
    late = proactive_analysis([120.0] * 90, {"1": 200.0, "3": 600.0}, parallelism=3, recovery=RecoveryView(
        started_at=68.0, observed_s=111.0, judge="backlog", from_parallelism=1, to_parallelism=3))
    kept, _ = decide(state, late, cfg(), DaedalusPolicy())
    assert kept.pending_recovery == pending
    own = proactive_analysis([120.0] * 90, {"1": 200.0, "3": 600.0}, parallelism=1, recovery=RecoveryView(
        started_at=193.0, observed_s=2.0, judge="backlog", from_parallelism=3, to_parallelism=1))
    spent, plan = decide(kept, own, cfg(), DaedalusPolicy())
    assert spent.pending_recovery is None
    assert [n.numbers["predicted_s"] for n in plan.notices if n.code == "recovered"] == [13.0]

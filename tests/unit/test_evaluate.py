"""The evaluation suite's driver: traces, the simulated runs, the oracle beside them, the command."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from contracts.backends import BackendKind
from evaluation.cli import evaluate_command
from evaluation.model_files import demo_job_model, demo_model
from evaluation.noise_bound import noise_draws
from evaluation.oracle import replay_schedule
from evaluation.simulator import (
    REPORTS_PER_WINDOW,
    WINDOW_S,
    PolicyRunner,
    ScheduleRunner,
    rate_factors,
    simulate,
    static_parallelism,
)
from evaluation.suite import (
    EvalSettings,
    bound_for,
    capacities_of,
    eval_config,
    evaluate_case,
    oracle_arguments,
    oracle_for,
    start_parallelism,
)
from evaluation.traces import TraceError, builtin_series, load_trace, own_deviations, read_trace_file, replay
from plan.policies.static import StaticPolicy

evaluate_app = typer.Typer()
evaluate_app.command()(evaluate_command)


def static(settings: EvalSettings) -> PolicyRunner:
    return PolicyRunner(StaticPolicy(), eval_config(settings))


@pytest.mark.parametrize("name", ["sine", "wiki", "steps"])
def test_traces_are_scaled_by_one_factor_to_the_peak_and_last_the_chosen_hours(name: str) -> None:
    trace = load_trace(name, hours=2.0, peak=1000.0)
    assert len(trace.rates) == 720  # 2 h of 10-s windows
    assert trace.rates.max() == pytest.approx(1000.0)
    # One factor: the ratios of the trace are kept (a stretch would map its minimum to 12.5 %).
    raw = load_trace(name, hours=2.0, peak=1.0)
    assert np.allclose(trace.rates, raw.rates * 1000.0)


def test_stretching_the_range_is_an_explicit_option() -> None:
    stretched = load_trace("wiki", hours=2.0, peak=1000.0, scaling="stretch")
    assert stretched.rates.min() == pytest.approx(125.0) and stretched.rates.max() == pytest.approx(1000.0)
    assert load_trace("wiki", hours=2.0, peak=1000.0).rates.min() > 300.0  # wiki varies far less than 8x


def test_scaling_to_the_mean() -> None:
    assert load_trace("avazu", hours=2.0, peak=500.0, scaling="mean").rates.mean() == pytest.approx(500.0)


def test_compression_is_stated() -> None:
    assert "12x compressed" in load_trace("wiki", hours=1.0).description
    assert "real time" in load_trace("sine", hours=1.0).description
    assert "real time" in load_trace("wiki", hours=1.0, regime="real-time").description


def test_real_time_replay_keeps_the_traces_own_short_term_variation() -> None:
    a, b = (load_trace("wiki", hours=6.0, regime="real-time", seed=s) for s in (1, 2))
    steps = np.abs(np.diff(np.log(a.rates)))
    # Not a straight line between 5-minute rows: windows within a row differ...
    assert np.median(steps) > 0.001
    # ...by about what the trace itself varies from row to row around its local level.
    own = np.std(own_deviations(builtin_series("wiki").values))
    assert 0.3 * own < np.std(np.diff(np.log(a.rates))) / np.sqrt(2) < 3 * own
    assert not np.allclose(a.rates, b.rates)  # each seed its own realisation
    assert np.array_equal(a.rates, load_trace("wiki", hours=6.0, regime="real-time", seed=1).rates)


@given(rows=st.lists(st.floats(0, 1000), min_size=4, max_size=60), row_s=st.sampled_from([0.5, 2.5, 3.125, 4.0]))
def test_windows_of_fast_rows_keep_the_load_generators_pace(rows: list[float], row_s: float) -> None:
    """Each window holds the records its own 10 s of the replay sends, rows split at its edges
    included: with 3.125-s rows (a day of 5-min rows in 15 min) window k covers rows 3.2 k to 3.2 (k + 1),
    and the replay does not fall behind by 0.2 rows a window."""
    from evaluation.traces import window_means

    values = np.asarray(rows)
    means = window_means(values, row_s, 10.0)
    assert len(means) == int(len(values) * row_s // 10.0 + 1e-9)
    for k, mean in enumerate(means):
        start, end = 10.0 * k, 10.0 * (k + 1)
        sent = sum(v * max(0.0, min(end, (i + 1) * row_s) - max(start, i * row_s)) for i, v in enumerate(values))
        assert mean * 10.0 == pytest.approx(sent, rel=1e-9, abs=1e-6)
    if 10.0 / row_s == int(10.0 / row_s):  # whole rows per window: their plain mean
        per = int(10.0 / row_s)
        usable = values[: len(means) * per]
        assert np.allclose(means, usable.reshape(-1, per).mean(axis=1))


@given(rows=st.lists(st.floats(0, 1000), min_size=2, max_size=40), row_s=st.sampled_from([0.5, 2.5, 3.125, 4.0, 12.0]))
def test_windows_as_the_load_generator_sends_them(rows: list[float], row_s: float) -> None:
    """Each window holds what the load generator's replay of the rows sends in it: its rate is linear
    between rows (row i at i x row_s), so the integral over each piece between breakpoints is exact by
    the midpoint rule."""
    from evaluation.traces import load_generator_windows
    from pipeline.loadgen import Replay

    shape = Replay(tuple(rows), row_s)
    means = load_generator_windows(np.asarray(rows), row_s, 10.0)
    assert len(means) == int(len(rows) * row_s // 10.0 + 1e-9)
    for k, mean in enumerate(means):
        start, end = 10.0 * k, 10.0 * (k + 1)
        cuts = sorted({start, end, *(i * row_s for i in range(len(rows)) if start < i * row_s < end)})
        sent = sum(shape.rate((a + b) / 2) * (b - a) for a, b in itertools.pairwise(cuts))
        assert mean * 10.0 == pytest.approx(sent, rel=1e-9, abs=1e-6)


def test_the_live_replay_is_what_the_load_generator_sends() -> None:
    """A day of wiki's 5-minute rows in 15 minutes, stretched onto 56-450 rec/s: the simulated replay
    holds the records `autoscaler load run` sends, window by window (its rows' minimum and maximum are
    scaled, not its windows')."""
    from agent.load_cli import replay_file
    from evaluation.traces import LOW_FRACTION, TRACE_FILES, TRACES

    rows, row_s = 288, 900 / 288
    trace = replay(builtin_series("wiki"), hours=0.25, rate=450.0, scaling="stretch", row_replay_s=row_s,
                   as_load_generator=True)
    shape = replay_file(TRACES / TRACE_FILES["wiki"], seconds_per_row=row_s, rows=rows, low=LOW_FRACTION * 450.0,
                        high=450.0)
    from pipeline.loadgen import records_between

    sent = np.array([records_between(shape, 10.0 * k, 10.0 * (k + 1), steps=4000) / 10.0 for k in range(90)])
    assert len(trace.rates) == 90
    assert np.allclose(trace.rates, sent, rtol=1e-3)
    # The windows' own min..max would have stretched the load further: 56-450 rec/s instead of 79-420.
    assert trace.rates.min() > 1.3 * LOW_FRACTION * 450.0 and trace.rates.max() < 0.95 * 450.0


def test_static_pays_its_slots_for_the_whole_replay_and_never_rescales() -> None:
    trace = load_trace("steps", hours=1.0, peak=1000.0)
    model = demo_model()
    p = static_parallelism(model, float(trace.rates.max()), 12)
    assert model.capacity(p) >= trace.rates.max() > model.capacity(p - 1)
    run = simulate(trace, model, static(EvalSettings()), eval_config(EvalSettings()), p, 60.0)
    assert run.slot_seconds == pytest.approx(p * 3600)
    assert run.actions == 0 and run.beyond_target_s == 0


def test_a_case_runs_every_policy_and_the_oracle_on_the_same_load_and_noise() -> None:
    result = evaluate_case("steps", "compressed", 0, ["static", "default", "ds2"], EvalSettings(hours=1.0, peak=1000.0))
    runs = {r["policy"]: r for r in result["runs"]}
    assert runs["default"]["actions"] > 0
    assert runs["default"]["slot_seconds"] < runs["static"]["slot_seconds"]
    assert result["oracle"]["slot_seconds"] <= result["static_slot_seconds"]
    assert result["oracle"]["feasible"]
    for run in result["runs"]:
        assert run["vs_oracle"] == pytest.approx(run["slot_seconds"] / result["oracle"]["slot_seconds"], abs=1e-3)
        assert {"slot_seconds", "seconds_beyond_target", "actions", "restarts", "peak_backlog"} <= set(run)
        assert run["vs_noise_bound"] == pytest.approx(run["slot_seconds"] / result["noise_bound"]["slot_seconds"],
                                                      abs=1e-3)
    assert result["noise_bound"]["accepted"] and 0 < result["noise_bound"]["margin"] <= 1
    assert set(result["timelines"]) == {"static", "default", "ds2", "oracle"}


def test_the_noise_aware_bounds_schedule_fares_in_the_simulator_as_its_replay_says() -> None:
    """The bound judges its schedules with the oracle's model; the simulator, run on the same schedule and
    one of the bound's noise draws, finds the same time beyond the target and the same cost."""
    settings = EvalSettings(hours=2.0, peak=1000.0)
    trace = load_trace("wiki", settings.hours, settings.peak, WINDOW_S, "compressed", 1)
    model = demo_job_model().model(in_place=False)
    start = start_parallelism(model, trace.rates, settings.max_parallelism)
    capacities = capacities_of(model, settings)
    bound = bound_for(trace, model, start, settings, capacities, seed=1)
    rates, args = oracle_arguments(trace, model, start, settings)
    for draw in noise_draws(len(trace.rates), REPORTS_PER_WINDOW, settings.noise, 3, seed=1):
        replayed = replay_schedule(bound.parallelism, rates, capacities, rate_factors=draw, **args)
        schedule = ScheduleRunner(bound.parallelism[::REPORTS_PER_WINDOW], trace.window_s)
        run = simulate(trace, model, schedule, eval_config(settings), start, settings.backlog_target_s,
                       factors=draw[::REPORTS_PER_WINDOW])
        assert run.beyond_target_s == replayed.violations * trace.window_s
        assert run.slot_seconds == pytest.approx(bound.slot_seconds)


@pytest.mark.parametrize("backend", list(BackendKind))
def test_the_oracles_schedule_replayed_in_the_simulator_keeps_the_target_at_the_cost_it_computed(
        backend: BackendKind) -> None:
    """The oracle's model is the simulator's, restarts or executors changed in place (a scale-up at the old
    capacity while its executors register, a scale-down's hold): its schedule replays to the same cost."""
    settings = EvalSettings(hours=2.0, peak=1000.0, backend=backend)
    for name, regime, seed in (("steps", "compressed", 0), ("wiki", "real-time", 3), ("drop", "compressed", 1)):
        trace = load_trace(name, settings.hours, settings.peak, WINDOW_S, regime, seed)
        model = demo_job_model().model(in_place=backend is BackendKind.IN_PLACE)
        factors = rate_factors(len(trace.rates), seed, settings.rate_noise)
        start = start_parallelism(model, trace.rates, settings.max_parallelism)
        capacities = capacities_of(model, settings)
        oracle, loose = oracle_for(trace, model, factors, start, settings, capacities)
        assert oracle.feasible and loose.slot_seconds <= oracle.slot_seconds + 1e-6
        schedule = ScheduleRunner(oracle.parallelism[::REPORTS_PER_WINDOW], trace.window_s)
        run = simulate(trace, model, schedule, eval_config(settings), start, settings.backlog_target_s,
                       factors=factors)
        assert run.beyond_target_s == 0, (name, regime)
        assert run.slot_seconds == pytest.approx(oracle.slot_seconds)
        assert run.actions == oracle.rescales
        np.testing.assert_allclose(run.timeline.backlog, oracle.backlog[REPORTS_PER_WINDOW - 1::REPORTS_PER_WINDOW],
                                   rtol=1e-6, atol=1e-3)


@settings(max_examples=6, deadline=None)
@given(name=st.sampled_from(["steps", "spikes", "step-up", "drop", "wiki", "avazu", "jumpy", "jumpy-bursty"]),
       regime=st.sampled_from(["compressed", "real-time"]), seed=st.integers(0, 10_000))
def test_no_policy_run_within_the_target_is_cheaper_than_the_oracle(name: str, regime: str, seed: int) -> None:
    policies = ["static", "threshold", "ds2", "flink", "reactive", "default"]
    result = evaluate_case(name, regime, seed, policies, EvalSettings(hours=0.75, peak=1000.0, noise_bound=False))  # type: ignore[arg-type]
    assert result["oracle"]["feasible"]
    for run in result["runs"]:
        if run["seconds_beyond_target"] == 0:
            assert run["slot_seconds"] >= result["oracle"]["slot_seconds"] - 1e-6, run["policy"]

def test_the_command_prints_a_table_and_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "evaluate.json"
    mine = tmp_path / "mine.csv"
    mine.write_text("seconds,rate\n" + "".join(f"{60 * i},{100 + (i % 20) * 10}\n" for i in range(60)))
    result = CliRunner().invoke(evaluate_app, [
        "--policy", "default", "--policy", "threshold", "--trace", "spikes", "--trace-file", str(mine),
        "--hours", "0.5", "--seeds", "2", "--regime", "compressed", "--workers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "spikes" in result.output and "threshold" in result.output and "mine" in result.output
    data = json.loads(out.read_text())
    cases = [(c["trace"], c["regime"], c["seed"]) for c in data["cases"]]
    assert cases == [("spikes", "real-time", 0), ("spikes", "real-time", 1),
                     (str(mine), "compressed", 0), (str(mine), "compressed", 1)]
    assert [r["policy"] for r in data["cases"][0]["runs"]] == ["default", "threshold"]
    assert {"slot_seconds", "actions", "seconds_beyond_target"} <= set(data["cases"][0]["oracle"])
    assert (tmp_path / "evaluate" / "spikes-real-time.png").stat().st_size > 10_000
    assert "| default |" in (tmp_path / "evaluate.md").read_text() or "| **default** |" in \
        (tmp_path / "evaluate.md").read_text()


@pytest.mark.parametrize(("text", "expected"), [
    ("", "empty file"),
    ("time,rate\n0,1\n1,2\n", "lacks column(s) seconds"),
    ("seconds,rate\n0,1\n", "at least 2 are needed"),
    ("seconds,rate\n0,1\n10,2\n5,3\n", "rows must be sorted"),
    ("seconds,rate\n-10,1\n0,2\n10,3\n", "negative time"),
    ("seconds,rate\n0,1\n10,-2\n20,3\n", "negative rate"),
    ("seconds,rate\n0,1\n10,lots\n20,3\n", "is not two numbers"),
    ("seconds,rate\n0,1\n10,2\n30,3\n", "irregular sampling"),
])
def test_a_bad_trace_file_gets_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=re.escape(expected)):
        read_trace_file(path)
    result = CliRunner().invoke(evaluate_app, ["--trace-file", str(path), "--json", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and expected.split()[0] in result.output


def test_a_trace_file_with_its_own_sampling(tmp_path: Path) -> None:
    path = tmp_path / "five.csv"
    path.write_text("rate,seconds\n" + "".join(f"{10 + i},{300 * i}\n" for i in range(100)))
    series = read_trace_file(path)
    assert series.row_s == 300.0 and series.values[3] == 13.0
    assert "12x compressed" in load_trace(str(path), hours=1.0).description


def test_the_command_refuses_an_unknown_policy(tmp_path: Path) -> None:
    result = CliRunner().invoke(evaluate_app, ["--policy", "magic", "--json", str(tmp_path / "x.json")])
    assert result.exit_code != 0
    assert "unknown policy" in result.output


def test_the_command_refuses_an_unknown_backend_and_a_job_model_without_in_place_times(tmp_path: Path) -> None:
    result = CliRunner().invoke(evaluate_app, ["--backend", "teleport", "--json", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and "choose restart or inplace" in result.output
    bare = demo_job_model().model_copy(update={"ramp_up_s": None, "hold_down_s": None})
    (tmp_path / "job.json").write_text(bare.model_dump_json())
    result = CliRunner().invoke(evaluate_app, ["--backend", "inplace", "--job-model", str(tmp_path / "job.json"),
                                               "--json", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and "no in-place times" in result.output


def test_noise_is_reproducible() -> None:
    trace = load_trace("spikes", hours=0.5)
    config = eval_config(EvalSettings())
    runs = [simulate(trace, demo_model(), static(EvalSettings()), config, 4, 60.0, seed=3) for _ in range(2)]
    assert np.array_equal(runs[0].timeline.backlog, runs[1].timeline.backlog)


def test_live_runs_are_measured_as_simulated_ones() -> None:
    from contracts.analyses import Analysis
    from contracts.decisions import EventType, ScalingEvent
    from evaluation.live import live_measures
    from stack.live import LiveRun

    def window(end: float, p: int, arrival: float, backlog: int) -> Analysis:
        return Analysis(job_id="j", window_end=end, parallelism=p, valid=True, true_processing_rate=200.0,
                        true_output_rate=200.0, observed_processing_rate=arrival, utilization=0.5,
                        arrival_rate=arrival, backlog=backlog, closed_at=end)

    run = LiveRun(started=0.0)
    run.analyses = [window(t, 1 if t <= 30 else 3, 100.0, 9_000 if t in (50, 60) else 100) for t in range(10, 101, 10)]
    # Stopped at 35 s for 10 s: one slot is paid until 35 s, three from then on.
    run.events = [ScalingEvent(decision_id="d", job_id="j", type=EventType.COMPLETED, timestamp=45.0,
                               from_parallelism=1, to_parallelism=3, downtime_s=10.0)]
    measured = live_measures(run, backlog_target_s=60.0)
    assert measured["slot_seconds"] == pytest.approx(1 * 35 + 3 * 65)  # from 0 s (first window's start) to 100 s
    assert measured["beyond_target_s"] == 20.0  # two windows with 90 s of arrivals queued
    assert measured["actions"] == 1
    assert measured["lag_max_s"] == pytest.approx(90.0)
    assert measured["peak_backlog"] == 9_000
    assert measured["start_s"] == 0.0  # the first window began when the run did
    # The load generator says when its first records were due: the job's start counts from then.
    run.load_summary = {"began_at": 6.5}
    assert live_measures(run, backlog_target_s=60.0)["start_s"] == -6.5
    # Every decision is kept, holds too, on the load's clock (the simulator's), with its numbers.
    from contracts.decisions import Action, DecisionReason, ScalingDecision
    run.decisions = [ScalingDecision(job_id="j", window_end=end, action=action, from_parallelism=1, to_parallelism=to,
                                     policy="default", target_utilization=0.8, closed_at=end,
                                     reason=DecisionReason(code=code, rule="default", message=code,
                                                           numbers={"planned_rate_now": 100.0}))
                     for end, action, to, code in ((40.0, Action.SCALE_UP, 3, "cost_plan"),
                                                   (30.0, Action.NONE, 1, "planned_hold"))]
    rows = run.decision_rows(6.5)
    assert [(r["at_s"], r["action"], r["to"], r["code"]) for r in rows] == [
        (23.5, "none", 1, "planned_hold"), (33.5, "scale_up", 3, "cost_plan")]
    assert rows[0]["numbers"] == {"planned_rate_now": 100.0}


def test_a_watched_warm_ups_windows_and_actions_are_not_the_loads() -> None:
    from contracts.analyses import Analysis
    from contracts.decisions import EventType, ScalingEvent
    from evaluation.live import live_measures
    from stack.live import LiveRun

    def window(end: float, arrival: float, backlog: int) -> Analysis:
        return Analysis(job_id="j", window_end=end, parallelism=2, valid=True, true_processing_rate=200.0,
                        true_output_rate=200.0, observed_processing_rate=arrival, utilization=0.5,
                        arrival_rate=arrival, backlog=backlog, closed_at=end)

    # Watched for 30 s before the load began at 100 s; the job went 1 -> 2 at 80 s, in the warm-up.
    run = LiveRun(started=100.0, watched_s=30.0, load_summary={"began_at": 100.0})
    run.analyses = [window(t, 50.0, 20_000 if t < 100 else 100) for t in range(75, 200, 10)]
    completed = ScalingEvent(decision_id="d", job_id="j", type=EventType.COMPLETED, timestamp=80.0,
                             from_parallelism=1, to_parallelism=2, downtime_s=1.0)
    recovered = ScalingEvent(decision_id="d", job_id="j", type=EventType.RECOVERED, timestamp=90.0,
                             from_parallelism=1, to_parallelism=2, numbers={"observed_s": 5.0, "predicted_s": 4.0})
    run.events = [completed, recovered]
    measured = live_measures(run, backlog_target_s=60.0)
    assert measured["actions"] == 0 and measured["downtimes_s"] == []
    assert measured["beyond_target_s"] == 0.0 and measured["peak_backlog"] == 100  # the warm-up's windows out
    assert measured["slot_seconds"] == pytest.approx(2 * (195 - 100))  # from the load's start, at the 2 it began at
    assert measured["start_s"] == 0.0
    assert run.recoveries(since=100.0) == [] and len(run.recoveries()) == 1
    # A rescale started in the warm-up (at 95 s) recovers in the load (at 120 s): the warm-up's too. One the
    # load's scale-up started (at 130 s) and a later window's decision told of (its own id) is the load's.
    late = [ScalingEvent(decision_id="w", job_id="j", type=EventType.STARTED, timestamp=95.0, from_parallelism=2,
                         to_parallelism=3),
            ScalingEvent(decision_id="w", job_id="j", type=EventType.COMPLETED, timestamp=101.0, from_parallelism=2,
                         to_parallelism=3, downtime_s=1.0),
            ScalingEvent(decision_id="x", job_id="j", type=EventType.RECOVERED, timestamp=120.0, from_parallelism=2,
                         to_parallelism=3, numbers={"observed_s": 19.0, "predicted_s": 15.0}),
            ScalingEvent(decision_id="u", job_id="j", type=EventType.STARTED, timestamp=130.0, from_parallelism=3,
                         to_parallelism=4),
            ScalingEvent(decision_id="u", job_id="j", type=EventType.COMPLETED, timestamp=131.0, from_parallelism=3,
                         to_parallelism=4, downtime_s=1.0),
            ScalingEvent(decision_id="y", job_id="j", type=EventType.RECOVERED, timestamp=150.0, from_parallelism=3,
                         to_parallelism=4, numbers={"observed_s": 19.0, "predicted_s": 20.0})]
    warmed = LiveRun(started=100.0, watched_s=30.0, events=[*run.events, *late])
    assert [(r["from"], r["to"]) for r in warmed.recoveries(since=100.0)] == [(3, 4)]
    assert len(warmed.recoveries()) == 3 and len(warmed.recoveries(since=120.0)) == 1
    unwatched = LiveRun(started=100.0, load_summary={"began_at": 100.0}, analyses=run.analyses, events=run.events)
    assert live_measures(unwatched, backlog_target_s=60.0)["actions"] == 1
    # A rescale started in the warm-up (at 96 s) and finished in the load (at 104 s) is the warm-up's; one
    # started in the load is the load's.
    def event(decision: str, kind: EventType, at: float) -> ScalingEvent:
        return ScalingEvent(decision_id=decision, job_id="j", type=kind, timestamp=at, from_parallelism=2,
                            to_parallelism=3, downtime_s=1.0)
    run.events = [completed, event("e", EventType.STARTED, 96.0), event("e", EventType.COMPLETED, 104.0),
                  event("f", EventType.STARTED, 150.0), event("f", EventType.COMPLETED, 158.0)]
    measured = live_measures(run, backlog_target_s=60.0)
    assert (measured["actions"], measured["warm_up_actions"]) == (1, 2)
    assert measured["downtimes_s"] == [1.0]


def test_a_simulated_run_measured_as_live_leaves_out_the_windows_the_job_was_down() -> None:
    # 10-s windows, as live: the demo job's 22.7-s scale-up leaves a whole window without a report.
    trace = replay(builtin_series("sine"), hours=0.1, rate=300.0, window_s=10.0)
    schedule = np.array([1] * 10 + [3] * (len(trace.rates) - 10))
    run = simulate(trace, demo_model(), ScheduleRunner(schedule, trace.window_s), eval_config(EvalSettings()), 1, 60.0)
    timeline = run.timeline
    down = [i for i, seen in enumerate(timeline.observed) if not seen]
    assert down and all(10 <= i <= 12 for i in down)
    measured = run.as_measured_live(60.0)
    seen = [b for b, o in zip(timeline.backlog, timeline.observed, strict=True) if o]
    assert measured["peak_backlog"] == pytest.approx(max(seen), abs=0.1)
    # The restart's peak is the truth's, not what the job reports once it is back.
    assert run.peak_backlog == pytest.approx(max(timeline.backlog[i] for i in down), abs=0.1)
    assert measured["peak_backlog"] < run.peak_backlog


def test_time_beyond_target_counts_each_late_window_from_the_one_before() -> None:
    """One measure for the simulator, the live runs and the benchmarks: a late window counts the time since
    the window before it, so a job that reports seldom (busy, or down for a restart) is not undercounted."""
    from contracts.analyses import records_beyond_target
    from evaluation.simulator import Timeline, seconds_beyond_target

    assert records_beyond_target(3_000, 100.0, 20.0) == 1_000.0
    assert records_beyond_target(2_000, 100.0, 20.0) == 0.0 and records_beyond_target(None, None, 20.0) == 0.0
    ends, arrival = np.array([5.0, 20.0, 40.0, 60.0]), np.full(4, 100.0)
    backlog = np.array([0.0, 5_000.0, 5_000.0, 0.0])
    assert seconds_beyond_target(ends, arrival, backlog, 20.0, first_s=5.0) == 35.0  # 15 s since 5, 20 since 20
    assert seconds_beyond_target(ends[1:2], arrival[1:2], backlog[1:2], 20.0, first_s=5.0) == 5.0
    assert seconds_beyond_target(np.array([]), np.array([]), np.array([]), 20.0, first_s=5.0) == 0.0
    # The simulator: a window the job did not report in (down) counts with the next late one it reports.
    timeline = Timeline(arrival=[100.0] * 4, backlog=[0.0, 9_000.0, 9_000.0, 0.0], window_s=10.0)
    seen = np.array([True, False, True, True])
    assert timeline.backlog_measures(seen, 60.0)[1] == 20.0
    assert timeline.backlog_measures(np.ones(4, dtype=bool), 60.0)[1] == 20.0


def test_a_long_live_runs_drift_compares_its_first_and_last_spans() -> None:
    from evaluation.live import drift_summary

    # 40 minutes of 10-s windows; the replay's rates are the run's, shifted by two windows, and in
    # the last 10 minutes the load generator produces 5 % short and the per-slot rate falls by 20 %.
    n = 240
    rates = 100.0 + 50.0 * np.sin(np.arange(n + 2) / 20.0)
    windows = []
    for i in range(n):
        late = i >= n - 60
        windows.append({"window_end": 1000.0 + 10 * (i + 1), "arrival_rate": rates[i + 2] * (0.95 if late else 1.0),
                        "valid": True, "utilization": 0.5, "parallelism": 2,
                        "true_processing_rate": 160.0 if late else 200.0,
                        "batch_overhead_s": 0.4, "backlog": 10})
    drift = drift_summary(windows, rates)
    assert drift["alignment_windows"] == -2
    assert drift["first"]["produced_vs_replayed"] == pytest.approx(0.0, abs=1e-9)
    assert drift["last"]["produced_vs_replayed"] == pytest.approx(-0.05, abs=1e-9)
    assert drift["slot_rate_change"] == pytest.approx(-0.2) and drift["matched_windows"] == 60
    # Compared with windows of the same load only: a rate that follows the load is no drift.
    for w in windows:
        w["true_processing_rate"] = 100.0 + w["arrival_rate"]
    assert drift_summary(windows, rates)["slot_rate_change"] == pytest.approx(0.0, abs=0.03)
    assert (drift["first"]["from_s"], drift["first"]["to_s"], drift["last"]["windows"]) == (120, 720, 60)
    assert drift_summary(windows[:100], rates) == {}  # shorter than two spans and the warm-up
    # A window after the replay's end (the load stopped during it) has no replay row: it is left out
    # of both counts, not added to the produced ones.
    after_end = [*windows, {**windows[-1], "window_end": windows[-1]["window_end"] + 10, "arrival_rate": 99.0}]
    last = drift_summary(after_end, rates[:n + 2])["last"]
    assert last["produced_vs_replayed"] == pytest.approx(-0.05, abs=1e-9) and last["windows"] == 59


def test_live_benchmarks_get_topics_of_their_own() -> None:
    from stack.services import isolated_settings

    settings = isolated_settings(9092, 6380, "e1a2b3", "evaluate-1a2b3", loop_interval_s=10.0)
    assert settings.kafka_bootstrap == "127.0.0.1:9092"
    assert settings.redis_url == "redis://127.0.0.1:6380/0"
    assert settings.topics.metrics.startswith("e1a2b3.") and settings.topics.decisions.startswith("e1a2b3.")
    assert (settings.app_id, settings.loop_interval_s, settings.topic_partitions) == ("evaluate-1a2b3", 10.0, 4)


def test_recovery_errors_compare_predictions_with_what_the_detector_timed() -> None:
    from evaluation.live import recovery_errors

    rows = [{"from": 1, "to": 5, "predicted_s": 41.0, "observed_s": 50.0},
            {"from": 5, "to": 1, "predicted_s": 8.0, "observed_s": 10.0},
            {"from": 1, "to": 2, "predicted_s": 95.0, "observed_s": 40.0},
            {"from": 2, "to": 1, "predicted_s": None, "observed_s": 20.0}]
    summary = recovery_errors(rows)
    assert [r["relative_error"] for r in summary["rows"]] == [0.18, 0.2, 1.375, None]
    assert summary["predicted"] == 3 and summary["recoveries"] == 4 and summary["too_long"] == 1
    assert summary["median_error"] == 0.2 and summary["max_error"] == 1.375
    assert recovery_errors([])["median_error"] is None

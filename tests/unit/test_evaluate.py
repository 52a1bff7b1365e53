"""The evaluation suite's driver: traces, the simulated runs, the oracle beside them, the command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from evaluation.cli import evaluate_command
from evaluation.jobmodel import demo_model
from evaluation.simulator import PolicyRunner, simulate, static_parallelism
from evaluation.suite import EvalSettings, eval_config, evaluate_trace
from evaluation.traces import load_trace
from plan.policies.static import StaticPolicy

evaluate_app = typer.Typer()
evaluate_app.command()(evaluate_command)


def static(settings: EvalSettings) -> PolicyRunner:
    return PolicyRunner(StaticPolicy(), eval_config(settings))


@pytest.mark.parametrize("name", ["sine", "wiki", "steps"])
def test_traces_are_mapped_onto_the_chosen_range_and_last_the_chosen_hours(name: str) -> None:
    trace = load_trace(name, hours=2.0, peak=1000.0)
    assert len(trace.rates) == 720  # 2 h of 10-s windows
    assert trace.rates.max() <= 1000.0 + 1e-6
    assert trace.rates.min() >= 125.0 - 1e-6
    assert trace.rates.max() > 900.0  # the peak is reached (up to window averaging)


def test_compression_is_stated() -> None:
    assert "12x compressed" in load_trace("wiki", hours=1.0).description
    assert "real time" in load_trace("sine", hours=1.0).description


def test_static_pays_its_slots_for_the_whole_replay_and_never_rescales() -> None:
    trace = load_trace("steps", hours=1.0, peak=1000.0)
    model = demo_model()
    p = static_parallelism(model, float(trace.rates.max()), 12)
    assert model.capacity(p) >= trace.rates.max() > model.capacity(p - 1)
    run = simulate(trace, model, static(EvalSettings()), eval_config(EvalSettings()), p, 60.0)
    assert run.slot_seconds == pytest.approx(p * 3600)
    assert run.actions == 0 and run.beyond_target_s == 0


def test_every_record_is_accounted_for_in_an_autoscaled_run() -> None:
    result = evaluate_trace("steps", ["static", "default", "ds2"], EvalSettings(hours=1.0, peak=1000.0))
    runs = {r["policy"]: r for r in result["runs"]}
    assert runs["default"]["actions"] > 0
    assert runs["default"]["slot_seconds"] < runs["static"]["slot_seconds"]
    # The oracle is a schedule too: never costlier than static provisioning, which meets the target.
    assert result["oracle"]["slot_seconds"] <= result["static_slot_seconds"]
    assert result["oracle"]["feasible"]
    for run in result["runs"]:
        assert run["vs_oracle_pct"] == pytest.approx(100 * run["slot_seconds"] / result["oracle"]["slot_seconds"],
                                                     abs=0.1)
    assert set(result["timelines"]) == {"static", "default", "ds2", "oracle"}


def test_the_command_prints_a_table_and_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "evaluate.json"
    result = CliRunner().invoke(evaluate_app, ["--policy", "default", "--policy", "threshold", "--trace", "spikes",
                                            "--hours", "0.5", "--workers", "1", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    assert "spikes" in result.output and "threshold" in result.output
    data = json.loads(out.read_text())
    assert [r["policy"] for r in data["results"][0]["runs"]] == ["default", "threshold"]
    assert (tmp_path / "evaluate" / "spikes.png").stat().st_size > 10_000
    assert "| default |" in (tmp_path / "evaluate.md").read_text()


def test_the_command_refuses_an_unknown_policy(tmp_path: Path) -> None:
    result = CliRunner().invoke(evaluate_app, ["--policy", "magic", "--json-out", str(tmp_path / "x.json")])
    assert result.exit_code != 0
    assert "unknown policy" in result.output


def test_noise_is_reproducible() -> None:
    trace = load_trace("spikes", hours=0.5)
    config = eval_config(EvalSettings())
    runs = [simulate(trace, demo_model(), static(EvalSettings()), config, 4, 60.0, seed=3) for _ in range(2)]
    assert np.array_equal(runs[0].timeline.backlog, runs[1].timeline.backlog)


def test_live_runs_are_measured_as_simulated_ones() -> None:
    from contracts.messages import Analysis, EventType, ScalingEvent
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


def test_live_benchmarks_get_topics_of_their_own() -> None:
    from stack.services import isolated_settings

    settings = isolated_settings(9092, 6380, "e1a2b3", "evaluate-1a2b3", loop_interval_s=10.0)
    assert settings.kafka_bootstrap == "127.0.0.1:9092"
    assert settings.redis_url == "redis://127.0.0.1:6380/0"
    assert settings.topics.metrics.startswith("e1a2b3.") and settings.topics.decisions.startswith("e1a2b3.")
    assert (settings.app_id, settings.loop_interval_s, settings.topic_partitions) == ("evaluate-1a2b3", 10.0, 4)

"""End to end, proactive: the Daedalus sine trace replayed time-compressed into the demo Spark job,
autoscaled by the hybrid policy. The job is scaled out before the load reaches its capacity, so the
backlog stays within the bound of what its restarts add, and recoveries are reported."""

from __future__ import annotations

import json
from pathlib import Path

from contracts.decisions import EventType
from contracts.settings import Settings
from evaluation.traces import TRACE_FILES, TRACES
from stack.live import WARM_UP_FIRST_ID, run_live

TRACE = TRACES / TRACE_FILES["sine"]
# One sine period is 10,800 rows (3 h at 1 s). From the trough (row 8,100) to just past the peak
# (13,500): 5,700 rows at 0.045 s each, 256 s of load; the 3 h rise takes 243 s.
START_ROW, ROWS, SECONDS_PER_ROW = 8_100, 5_700, 0.045
LOW, HIGH = 100.0, 700.0  # rec/s; the demo job carries about 200 per slot
# Beyond what arrives while the job restarts, at most this many seconds of arrivals may wait.
BACKLOG_BOUND_S = 15.0


def test_the_sine_trace_is_met_by_scaling_out_ahead_of_the_load(settings: Settings, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"loop_interval_s": 5.0})
    overrides = {"policy": "hybrid", "restart_time_s": "20", "scale_down_delay_s": "20", "target_recovery_s": "60",
                 "forecast_horizon_s": "60", "forecast_min_points": "20", "checkpoint_interval_s": "5"}
    load = ["--trace", str(TRACE), "--start-row", str(START_ROW), "--rows", str(ROWS),
            "--seconds-per-row", str(SECONDS_PER_ROW), "--low", str(LOW), "--high", str(HIGH)]
    # Its own job id: knowledge outlives a test, and another test's "demo" may still be rescaling.
    # A short warm-up first (`autoscaler evaluate --live` runs 150 s): the agents learn nothing from it.
    run = run_live(settings, tmp_path, load, overrides, job="sine", warm_up_s=20.0, warm_up_rate=LOW, drain_s=25.0)
    timeline = run.timeline()
    print(timeline)
    warm_up = json.loads((tmp_path / "warm-up.log").read_text().strip().splitlines()[-1])
    assert warm_up["produced"] >= 0.9 * 20.0 * LOW and warm_up["start_id"] == WARM_UP_FIRST_ID, warm_up
    assert run.analyses and min(a.window_end for a in run.analyses) > run.started - settings.loop_interval_s, timeline

    assert not run.of(EventType.FAILED), timeline
    completed = run.of(EventType.COMPLETED)
    ups = [d for d in run.decisions if d.action.value == "scale_up"]
    assert ups and completed, timeline
    # The first scale-out was decided by the proactive policy while the current parallelism still
    # carried the load: ahead of it, not in reaction to a backlog.
    first = ups[0]
    assert first.reason.rule == "hybrid", timeline
    window = next(a for a in run.analyses if a.window_end == first.window_end)
    assert window.capacity is not None and window.capacity.current is not None, timeline
    assert window.arrival_rate is not None and window.arrival_rate < window.capacity.current, timeline
    # The backlog stays within what the longest restart lets pile up plus BACKLOG_BOUND_S of arrivals.
    longest_restart = max(e.downtime_s or 0.0 for e in completed)
    bound = HIGH * (longest_restart + BACKLOG_BOUND_S)
    worst = max(a.backlog or 0 for a in run.analyses)
    assert worst <= bound, (worst, bound, timeline)
    # Each rescale's recovery is observed and compared with its prediction.
    recovered = run.of(EventType.RECOVERED)
    assert recovered and any(e.numbers.get("predicted_s") is not None for e in recovered), timeline

"""End to end: a burst at 10x the arrival rate leaves a backlog; one scale-up drains it within the
catch-up duration, and the job is not scaled down before the backlog is gone.

Time is compressed: a 60 s catch-up duration and a 30 s scale-down delay (production defaults:
300 s each), 5 s windows. The demo job carries about 230 records/s per slot (4 ms per record).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from contracts.analyses import Analysis
from contracts.decisions import EventType, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import written_ids
from stack.processes import stop_pid
from stack.services import start_agents, start_job_runner, start_load
from tests.integration.kafka_helpers import Collector
from tests.integration.test_agents import register

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BASE_RATE, BURST_RATE = 100, 1000  # 10x
WARM_S, BURST_S, AFTER_S = 60, 10, 95
CATCH_UP_S = 60


def test_a_burst_backlog_is_drained_within_the_catch_up_duration_after_one_scale_up(
    settings: Settings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"loop_interval_s": 5.0})
    run = settings.topics.metrics.split(".")[0]
    input_topic, output_topic = f"{run}.burst.input", f"{run}.burst.output"
    agents = start_agents(settings, tmp_path / "agents.log")
    register(settings, "burst", policy="reactive", max_parallelism="8", catch_up_duration_s=str(CATCH_UP_S),
             scale_down_delay_s="30")
    collectors = {name: Collector(settings, getattr(settings.topics, name))
                  for name in ("analyses", "decisions", "scaling_events")}
    runner = start_job_runner(settings, "burst", tmp_path / "job", tmp_path / "runner.log", max_parallelism=8,
                              options={"cost_ms": "4", "input_topic": input_topic, "output_topic": output_topic})
    shape = f"steps:{BASE_RATE}:{WARM_S},{BURST_RATE}:{BURST_S},{BASE_RATE}:{AFTER_S}"
    load = start_load(settings, input_topic, tmp_path / "load.log", ["--shape", shape])
    load_started = time.time()
    try:
        deadline = time.monotonic() + WARM_S + BURST_S + AFTER_S + 60
        while load.poll() is None and time.monotonic() < deadline:
            for c in collectors.values():
                c.poll(0.3)
        assert load.poll() == 0, (tmp_path / "load.log").read_text()
        produced = json.loads((tmp_path / "load.log").read_text().strip().splitlines()[-1])["produced"]
        ids = written_ids(settings.kafka_bootstrap, output_topic, produced, timeout_s=120)
        assert sorted(ids) == list(range(produced)), (len(ids), len(set(ids)), produced)
        for c in collectors.values():
            c.poll(1)
    finally:
        for process in (load, runner):
            stop_pid(process.pid, timeout=60, process=process)
        agents.stop()
        for c in collectors.values():
            c.close()

    # This job's events only: a job of an earlier test may still have a rescale in flight.
    events = [e for e in (ScalingEvent.model_validate_json(v) for _, v, _ in collectors["scaling_events"].records)
              if e.job_id == "burst"]
    analyses = sorted((a for a in (Analysis.model_validate_json(v) for _, v, _ in collectors["analyses"].records)
                       if a.job_id == "burst"), key=lambda a: a.window_end)
    decisions = [ScalingDecision.model_validate_json(v) for _, v, _ in collectors["decisions"].records]
    timeline = "\n".join(
        [f"{e.timestamp - load_started:6.1f} {e.type.value} {e.from_parallelism}->{e.to_parallelism} "
         f"{e.downtime_s or ''} {e.error or ''}" for e in events]
        + [f"{a.window_end - load_started:6.1f} p={a.parallelism} valid={a.valid} arrival={a.arrival_rate:.0f} "
           f"backlog={a.backlog} tpr={a.true_processing_rate:.0f}" for a in analyses]
        + [f"{d.window_end - load_started:6.1f} {d.action.value} {d.from_parallelism}->{d.to_parallelism} "
           f"{d.reason.code}: {d.reason.message}" for d in decisions if d.reason.code != "at_optimal"]
    )
    print(timeline)
    completed = [e for e in events if e.type is EventType.COMPLETED]
    assert not [e for e in events if e.type is EventType.FAILED], timeline
    burst_end = load_started + WARM_S + BURST_S
    assert completed, timeline
    scale_up = completed[0]
    assert scale_up.to_parallelism > scale_up.from_parallelism == 1, timeline
    assert scale_up.timestamp > load_started + WARM_S, timeline  # caused by the burst, not before it
    # The backlog is drained (under 2 s of arrivals) within the catch-up duration of the restart ...
    drained = next((a for a in analyses if a.window_end > max(scale_up.timestamp, burst_end)
                    and a.backlog is not None and a.backlog <= 2 * BASE_RATE), None)
    assert drained is not None, timeline
    assert drained.window_end - scale_up.timestamp <= CATCH_UP_S, timeline
    # ... after that one scale-up ...
    ups = [e for e in completed if e.to_parallelism > e.from_parallelism]
    assert len(ups) == 1, timeline
    # ... and nothing is scaled down while it drains. (Whether a scale-down follows afterwards
    # depends on the per-slot rate read at low load, which per-batch costs understate.)
    downs = [e for e in events if e.type is EventType.STARTED and e.to_parallelism < e.from_parallelism]
    assert all(e.timestamp >= drained.window_end for e in downs), timeline
    draining = [d for d in decisions if scale_up.timestamp < d.window_end < drained.window_end]
    assert all(d.action.value != "scale_down" for d in draining), timeline

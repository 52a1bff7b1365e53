"""End to end: real broker, Redis, agents and Spark demo job, autoscaled out and back in by the default policy.

The demo job costs 4 ms of waiting per record, so one task slot carries at most 250 records/s (about 230 measured).
560 records/s need 3 slots; 100 records/s need one. The cost-based planner takes one scale-up for the
step and one scale-down after the drop: one action per load change.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from contracts.messages import Analysis, EventType, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import ensure_topics, written_ids
from stack.processes import stop_pid
from stack.services import start_agents, start_job_runner, start_load, wait_until_running
from tests.integration.kafka_helpers import Collector
from tests.integration.test_agents import register

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HIGH_RATE, HIGH_SECONDS = 560, 150
LOW_RATE, LOW_SECONDS = 100, 100


def test_demo_job_scales_out_in_one_step_keeps_up_scales_in_and_loses_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"loop_interval_s": 5.0})
    run = settings.topics.metrics.split(".")[0]
    input_topic, output_topic = f"{run}.demo.input", f"{run}.demo.output"
    agents = start_agents(settings, tmp_path / "agents.log")
    register(settings, "demo", max_parallelism="8")  # the defaults a user gets: the cost-based planner
    collectors = {name: Collector(settings, getattr(settings.topics, name))
                  for name in ("analyses", "decisions", "scaling_events")}
    ensure_topics(settings, extra=[input_topic, output_topic])
    runner = start_job_runner(settings, "demo", tmp_path / "job", tmp_path / "runner.log", max_parallelism=8,
                              options={"cost_ms": "4", "input_topic": input_topic, "output_topic": output_topic})
    # The step comes to a running job: Spark's start-up (20-40 s) would otherwise leave a backlog of its
    # own that the first decision must also drain, and this test is about the step.
    wait_until_running(runner, tmp_path / "runner.log")
    load = start_load(settings, input_topic, tmp_path / "load.log",
                      ["--shape", f"steps:{HIGH_RATE}:{HIGH_SECONDS},{LOW_RATE}:{LOW_SECONDS}"])
    load_started = time.time()
    try:
        deadline = time.monotonic() + HIGH_SECONDS + LOW_SECONDS + 60
        while load.poll() is None and time.monotonic() < deadline:
            for c in collectors.values():
                c.poll(0.3)
        assert load.poll() == 0, (tmp_path / "load.log").read_text()
        summary = json.loads((tmp_path / "load.log").read_text().strip().splitlines()[-1])
        produced = summary["produced"]
        assert produced >= 0.99 * (HIGH_RATE * HIGH_SECONDS + LOW_RATE * LOW_SECONDS), summary
        # Every input record appears exactly once in the output, across all the restarts.
        ids = written_ids(settings.kafka_bootstrap, output_topic, produced, timeout_s=180)
        assert len(ids) == len(set(ids)) == produced, (len(ids), len(set(ids)), produced)
        assert set(ids) == set(range(produced))
        for c in collectors.values():
            c.poll(1)
    finally:
        for process in (load, runner):
            stop_pid(process.pid, timeout=60, process=process)
        agents.stop()
        for c in collectors.values():
            c.close()

    events = [e for e in (ScalingEvent.model_validate_json(v) for _, v, _ in collectors["scaling_events"].records)
              if e.job_id == "demo"]
    analyses = [Analysis.model_validate_json(v) for _, v, _ in collectors["analyses"].records]
    analyses = [a for a in analyses if a.job_id == "demo"]
    decisions = [ScalingDecision.model_validate_json(v) for _, v, _ in collectors["decisions"].records]
    timeline = "\n".join(
        [f"{e.timestamp - load_started:6.1f} {e.type.value} {e.from_parallelism}->{e.to_parallelism} "
         f"{e.downtime_s or ''} {e.error or ''}" for e in events]
        + [f"{a.window_end - load_started:6.1f} p={a.parallelism} valid={a.valid} arrival={a.arrival_rate:.0f} "
           f"backlog={a.backlog} tpr={a.true_processing_rate:.0f}" for a in analyses]
        + [f"{d.timestamp - load_started:6.1f} {d.action.value} {d.from_parallelism}->{d.to_parallelism} "
           f"{d.reason.code}" for d in decisions if d.action.value != "none"]
    )
    print(timeline)
    completed = [e for e in events if e.type is EventType.COMPLETED]
    assert not [e for e in events if e.type is EventType.FAILED], timeline
    high_end = load_started + HIGH_SECONDS
    ups = [e for e in completed if e.to_parallelism > e.from_parallelism and e.timestamp < high_end]
    first_down_after_drop = next(
        (e for e in completed if e.to_parallelism < e.from_parallelism and e.timestamp >= high_end), None)

    # One scale-up for the step, and no other action while the load stays high ...
    actions_under_high_load = [e for e in completed if e.timestamp < high_end]
    assert len(ups) == 1 and actions_under_high_load == ups, timeline
    settled_at = ups[0].timestamp
    final = ups[0].to_parallelism
    assert 3 <= final <= 5, timeline
    assert all(d.policy == "default" for d in decisions if d.job_id == "demo"), timeline
    # ... and keeps up: once settled, the backlog stops growing for the rest of the high phase.
    settled = [a for a in analyses
               if settled_at + 10 < a.window_end <= high_end and a.parallelism == final and a.valid]
    assert len(settled) >= 4, timeline
    backlogs = [a.backlog or 0 for a in settled]
    assert backlogs[-1] <= max(backlogs[0], HIGH_RATE * 5), timeline
    # The offered load is sustained: a single window can split a producer burst with its neighbour
    # (701 then 442 records/s was seen), so judge the mean and bound each window loosely.
    arrivals = [a.arrival_rate or 0.0 for a in settled]
    assert sum(arrivals) / len(arrivals) > 0.9 * HIGH_RATE, timeline
    assert min(arrivals) > 0.5 * HIGH_RATE, timeline
    # The load drops, and it is scaled in, in one step.
    assert first_down_after_drop is not None, timeline
    assert [e for e in completed if e.timestamp >= high_end] == [first_down_after_drop], timeline
    assert first_down_after_drop.to_parallelism < final, timeline
    assert all(e.downtime_s is not None and e.downtime_s > 0 for e in completed), timeline

"""Rescales that go wrong, against a real Spark job runner and two execute workers.

- One rescale at a time: two execute workers that both read every decision (two deployments, a
  split brain) get two decisions for one job at once. One rescale runs, under one fencing token;
  the other decision is superseded and its event says so; the runner applies it once.
- Failed rescale: the job cannot start at the new parallelism. The runner retries within its
  bound, starts the last good parallelism again, execute emits `failed` with the reason and the
  parallelism rolled back to, and the job keeps running."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from contracts.decisions import Action, DecisionReason, EventType, RunnerReport, RunnerStatus, ScalingDecision
from contracts.messages import MetricReport
from contracts.settings import Settings
from infra.kafka import ensure_topic
from stack.processes import free_port, stop_pid
from stack.services import register_jobs, start_agents, start_job_runner, start_together
from tests.conftest import wait_until
from tests.integration.kafka_helpers import Collector, send
from tests.reliability.helpers import Ledger

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.reliability]

ENTRY = "tests.reliability.jobs:build_failing_above_two"


def decision(job: str, from_p: int, to_p: int) -> ScalingDecision:
    return ScalingDecision(
        job_id=job, window_end=time.time(), action=Action.SCALE_UP, from_parallelism=from_p, to_parallelism=to_p,
        policy="ds2", target_utilization=0.7, reason=DecisionReason(code="test", message="injected by the test"),
        mode="auto", closed_at=time.time(),
    )


def test_one_rescale_at_a_time_then_a_failed_rescale_rolls_back(settings: Settings, tmp_path: Path) -> None:
    job = f"faulty-{uuid.uuid4().hex[:4]}"
    register_jobs(settings, [job], policy="reactive")
    entry_env = {"AUTOSCALER_JOB_ENTRY_POINTS": f"pipeline.demo:build,{ENTRY}"}
    for topic in (f"{job}.in", f"{job}.out"):
        ensure_topic(settings.kafka_bootstrap, topic, 2)
    runner = start_job_runner(settings, job, tmp_path / "job", tmp_path / "runner.log",
                              options={"input_topic": f"{job}.in", "output_topic": f"{job}.out", "cost_ms": "1"},
                              args=["--entry", ENTRY, "--retries", "1", "--report-interval", "2"], env=entry_env)
    workers = []
    ledger = Ledger(settings)
    metrics = Collector(settings, settings.topics.metrics)
    reports = Collector(settings, settings.topics.runner_reports)
    try:
        # Two execute workers in two consumer groups: each reads every decision.
        # Started together: each returns once ready, and their group joins overlap.
        workers += start_together([partial(start_agents, settings, tmp_path / f"execute-{name}.log", ["execute"],
                                           env={"AUTOSCALER_WEB_PORT": str(free_port()),
                                                "AUTOSCALER_APP_ID": f"{settings.app_id}-{name}", **entry_env})
                                   for name in ("x", "y")])
        metrics.until(MetricReport.model_validate_json, lambda rs: any(r.job_id == job for r in rs), timeout=180)

        first, second = decision(job, 1, 2), decision(job, 1, 2)
        send(settings, settings.topics.decisions, [(job.encode(), d.to_bytes()) for d in (first, second)])
        wait_until(lambda: (ledger.poll(), any(e.type is EventType.COMPLETED for e in ledger.events()))[1],
                   timeout=180, message="the rescale to complete")
        ledger.watch(3)
        events = ledger.events()
        by_decision = {d.decision_id: [e for e in events if e.decision_id == d.decision_id] for d in (first, second)}
        ran = [d for d, got in by_decision.items() if any(e.type is EventType.STARTED for e in got)]
        assert len(ran) == 1, by_decision
        other = second.decision_id if ran[0] == first.decision_id else first.decision_id
        skipped = [e for e in by_decision[other] if e.type is EventType.SKIPPED]
        assert skipped and all(e.code == "superseded" for e in skipped), by_decision[other]
        assert {e.event_id for e in skipped} == {skipped[0].event_id}  # a repeat keeps its id
        assert {c.fencing_token for c in ledger.commands() if c.decision_id == ran[0]} != set()
        assert len({c.fencing_token for c in ledger.commands() if c.decision_id == ran[0]}) == 1
        assert not [c for c in ledger.commands() if c.decision_id == other]
        reports.poll(2)
        started = Counter(r.decision_id for r in (RunnerReport.model_validate_json(v) for _, v, _ in reports.records)
                          if r.status is RunnerStatus.STARTED)
        assert started == {ran[0]: 1}, f"the runner started the rescale {started} times"

        # A parallelism the job cannot start at: retried, rolled back, reported, still running.
        failing = decision(job, 2, 3)
        send(settings, settings.topics.decisions, [(job.encode(), failing.to_bytes())])
        asked_at = time.time()
        failed = wait_until(
            lambda: (ledger.poll(), [e for e in ledger.events()
                                     if e.decision_id == failing.decision_id and e.type is EventType.FAILED])[1],
            timeout=300, message="the failed event",
        )
        recovered_s = time.time() - asked_at
        event = failed[0]
        assert event.rolled_back_to == 2, event
        assert event.error and "no room for 3" in event.error, event
        assert runner.poll() is None, "the job runner died"
        log = (tmp_path / "runner.log").read_text(errors="replace")
        assert log.count("no room for 3") >= 2, "the start at 3 slots was not retried"
        after = time.time()
        fresh = metrics.until(MetricReport.model_validate_json,
                              lambda rs: any(r.job_id == job and r.timestamp > after for r in rs), timeout=60)
        assert [r.parallelism for r in fresh if r.job_id == job and r.timestamp > after][-1] == 2
        assert all(w.process.poll() is None for w in workers)
        print(f"\nrescale faults: 2 concurrent decisions -> 1 rescale, 1 superseded; failed rescale rolled back "
              f"to 2 and reported {recovered_s:.0f} s after the decision")
    finally:
        ledger.close()
        metrics.close()
        reports.close()
        for worker in workers:
            worker.stop()
        stop_pid(runner.pid, timeout=60, process=runner)
        assert isinstance(runner, subprocess.Popen)

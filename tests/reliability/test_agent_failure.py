"""Agent failure: a worker is killed (SIGKILL) mid-stream; the other takes over its partitions,
no window goes without its decision and no decision is executed twice."""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest

from contracts.settings import Settings
from stack.processes import free_port
from stack.services import register_jobs, start_agents, start_together
from tests.conftest import wait_until
from tests.reliability.helpers import EAGER, Ledger, ReportStream, audit, missing_decisions

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


def test_a_killed_worker_loses_no_decision_and_executes_none_twice(settings: Settings, tmp_path: Path) -> None:
    jobs = [f"kill-{i}" for i in range(8)]
    register_jobs(settings, jobs, **EAGER)
    # No job runner answers, so each rescale fails after 3 s and plan asks again: many executions.
    env = {"AUTOSCALER_RESCALE_TIMEOUT_S": "3"}
    ports = [free_port(), free_port()]
    # Together: each returns once ready (its partitions assigned), and their group joins overlap.
    workers = start_together([partial(start_agents, settings, tmp_path / f"worker-{port}.log",
                                      env={"AUTOSCALER_WEB_PORT": str(port), **env}) for port in ports])
    ledger = Ledger(settings)
    try:
        with ReportStream(settings, jobs, speedup=10.0) as stream:
            wait_until(lambda: (ledger.poll(), len(ledger.commands()) >= 4)[1], timeout=90,
                       message="the first rescale commands")
            # Kill the worker in the middle of its work: no shutdown, uncommitted offsets, a lock held.
            victim = workers[0]
            os.killpg(victim.process.pid, signal.SIGKILL)
            killed_at = time.time()
            ledger.watch(30)  # the session timeout (10 s), the rebalance and 20 s more of reports
        assert not stream.failed, stream.failed
        wait_until(lambda: (ledger.poll(), not missing_decisions(ledger, stream, settings))[1],
                   timeout=120, message="a decision for every closed window")
        # Time to recover: until every job had a decision again (the killed worker's jobs wait longest).
        resumed_after = max(
            min(at for at, d in ledger.decisions_received() if d.job_id == job and at > killed_at) - killed_at
            for job in jobs
        )
        wait_until(lambda: (ledger.poll(), not audit(ledger).unanswered)[1], timeout=60,
                   message="an execute outcome for every rescale decision")
        result = audit(ledger)
        assert workers[1].process.poll() is None, "the surviving worker died"
        assert result.windows_with_two_decisions == [], "a redelivered window was decided anew"
        assert result.executed_twice == [], "a decision was executed twice"
        assert result.rescales >= 8, f"too few rescales to tell anything: {result.rescales}"
        assert sum(len(stream.closed_windows(job, settings)) for job in jobs) == result.decisions
        # The takeover itself: the survivor's log shows it got the partitions of the killed worker.
        assert "assigned" in workers[1].log().lower() or "assignment" in workers[1].log().lower()
        print(f"\nkill: {result.decisions} windows decided, {result.rescales} rescales, 0 lost, 0 twice; "
              f"first decision {resumed_after:.1f} s after the kill; {result.duplicate_event_ids} events repeated "
              "with their id")
    finally:
        ledger.close()
        for worker in workers:
            worker.stop()

"""A subscriber sees each decision once. The plan worker is killed (SIGKILL) while it decides: the
decisions it committed after its last Kafka offset commit are published again by its successor, under
the same decision ids; `autoscaler watch` (`infra.subscribe`) prints each decision once."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from contracts.analyses import Analysis
from contracts.decisions import ScalingDecision
from contracts.settings import Settings, settings_env
from infra.kafka import ensure_topics
from stack.processes import free_port, spawn, stop_pid
from stack.services import autoscaler_argv, register_jobs, start_agents
from tests.conftest import wait_until
from tests.reliability.helpers import EAGER, TopicLog

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

JOBS, WINDOWS = 40, 25


def analysis(job: str, window_end: float) -> Analysis:
    """An overloaded job's window (2 slots all busy at 100 rec/s each, 400 arriving)."""
    return Analysis(job_id=job, window_end=window_end, parallelism=2, valid=True, true_processing_rate=100.0,
                    true_output_rate=100.0, observed_processing_rate=200.0, utilization=1.0, arrival_rate=400.0,
                    backlog=1000, closed_at=time.time())


def watch_lines(settings: Settings, out: Path, expected: set[str]) -> list[dict[str, object]]:
    """What `autoscaler watch --json --all-decisions --from-beginning` prints once it has shown every
    expected decision id and read on for 3 s more (repeats may lie after the last first copy)."""
    process = spawn("watch", autoscaler_argv("watch", "--json", "--all-decisions", "--from-beginning"), out,
                    {**settings_env(settings), "PYTHONUNBUFFERED": "1"})

    def printed() -> list[dict[str, object]]:
        return [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]

    try:
        wait_until(lambda: expected <= {str(m.get("decision_id")) for m in printed()}, timeout=60,
                   message="autoscaler watch printing every decision")
        time.sleep(3)
    finally:
        process.send_signal(signal.SIGINT)  # watch stops on Ctrl-C
        stop_pid(process.pid, timeout=15, process=process)
    return printed()


def test_a_decision_republished_after_a_plan_crash_reaches_a_watcher_once(settings: Settings, tmp_path: Path) -> None:
    jobs = [f"once-{i}" for i in range(JOBS)]
    register_jobs(settings, jobs, mode="recommend", **EAGER)  # decided and published, nothing executed
    ensure_topics(settings)
    decisions = TopicLog(settings, settings.topics.decisions)
    env = {"AUTOSCALER_WEB_PORT": str(free_port())}
    plan = start_agents(settings, tmp_path / "plan-1.log", stages=["plan"], env=env)
    successor = None
    try:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5})
        start = 1_795_000_000.0
        for w in range(WINDOWS):
            for job in jobs:
                producer.produce(settings.topics.analyses, key=job.encode(),
                                 value=analysis(job, start + 10 * (w + 1)).to_bytes())
        assert producer.flush(30) == 0
        # Kill the plan worker as soon as it publishes: it decides on, its offsets a commit behind.
        wait_until(lambda: (decisions.poll(0.05), len(decisions.records) > 0)[1], timeout=60,
                   interval=0.0, message="the first decisions")
        os.killpg(plan.process.pid, signal.SIGKILL)
        before_kill = len(decisions.records)
        successor = start_agents(settings, tmp_path / "plan-2.log", stages=["plan"],
                                 env={"AUTOSCALER_WEB_PORT": str(free_port())})

        def windows_decided() -> int:
            decisions.poll(0.5)
            return len({(d.job_id, d.window_end) for d in map(parsed, decisions.records)})

        wait_until(lambda: windows_decided() == JOBS * WINDOWS, timeout=90, message="every window decided")
        decisions.poll(3)  # republished decisions after the last new one of a partition
        published = [parsed(record) for record in decisions.records]
        ids = Counter(d.decision_id for d in published)
        repeated = sum(n - 1 for n in ids.values())
        per_window = {(d.job_id, d.window_end): set() for d in published}
        for d in published:
            per_window[(d.job_id, d.window_end)].add(d.decision_id)
        assert all(len(found) == 1 for found in per_window.values()), "a redelivered window was decided anew"
        assert repeated > 0, f"no decision was published twice ({len(published)} records): nothing to drop"

        shown = watch_lines(settings, tmp_path / "watch.out", set(ids))
        shown_ids = Counter(str(m["decision_id"]) for m in shown if "event_id" not in m)
        assert set(shown_ids) == set(ids), "watch lost a decision"
        assert max(shown_ids.values()) == 1, "watch printed a decision twice"
        print(f"\nplan killed after {before_kill} decisions; {len(ids)} decisions published {len(published)} times "
              f"({repeated} repeats); watch printed each once")
    finally:
        decisions.close()
        plan.stop()
        if successor is not None:
            successor.stop()


def parsed(record: tuple[bytes | None, bytes, float]) -> ScalingDecision:
    return ScalingDecision.model_validate_json(record[1])

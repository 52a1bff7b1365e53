"""One loop: a recorded report stream of two jobs, through the live agents (real broker and Redis) and
through the simulator's loop (`evaluation.loop.Loops`), gives the same decisions, field for field but
ids and wall-clock stamps.

The stream (tests/support/replay.py) holds a load step and a load drop, five rescales (each a job
restart: its reports stop, then resume at the new parallelism, and the runner's answer), a malformed
record and a report of an unregistered job. Halfway, the agents are restarted: they continue from
knowledge. Both paths are fed window by window; after each window the live side is waited for until
it has made as many decisions, commands and events as the simulator's loop did.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from contracts.dead_letters import DeadLetter
from contracts.decisions import RescaleCommand, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from evaluation.jobmodel import EPOCH
from stack.services import AgentWorker, register_jobs, start_agents
from tests.integration.kafka_helpers import Collector, send
from tests.support.replay import JOBS, answer, comparable, from_parallelism, in_process, load

pytestmark = pytest.mark.integration

WAIT_S = 60.0
RESTART_AT_WINDOW = 15


def register(settings: Settings) -> None:
    for job, (overrides, _, _) in JOBS.items():
        register_jobs(settings, [job], **overrides)


def unique(items: list, key) -> list:  # type: ignore[no-untyped-def,type-arg]
    """First of each id: a restarted agent publishes again what it had committed, same id."""
    seen: set[str] = set()
    out = []
    for item in items:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


def test_live_agents_and_the_simulators_loop_make_the_same_decisions(
    settings: Settings, agents: AgentWorker, tmp_path: Path
) -> None:
    register(settings)
    now_window = math.floor(time.time() / 10) * 10
    groups = load(0.0)
    shift = now_window - 10 * (len(groups) + 2) - EPOCH  # every report in the past, windows aligned
    groups = load(shift)
    loops, expected = in_process(groups, settings)
    assert any(d.action.value == "scale_up" for d in loops.decisions)
    assert any(d.action.value == "scale_down" for d in loops.decisions)

    topics = settings.topics
    decisions = Collector(settings, topics.decisions)
    commands = Collector(settings, topics.commands)
    events = Collector(settings, topics.scaling_events)
    letters = Collector(settings, topics.dead_letter)
    worker = agents
    try:
        for group, counts in zip(groups, expected, strict=True):
            if group.window == RESTART_AT_WINDOW:
                worker.stop()
                worker = start_agents(settings, tmp_path / "agents-again.log")
            send(settings, topics.metrics, group.records)
            live = decisions.until(ScalingDecision.model_validate_json, lambda got, c=counts: all(
                sum(d.job_id == job for d in unique(got, lambda d: d.decision_id)) >= n
                for job, n in c.decisions.items()), timeout=WAIT_S)
            sent = commands.until(RescaleCommand.model_validate_json, lambda got, c=counts: all(
                sum(x.job_id == job for x in unique(got, lambda x: x.decision_id)) >= n
                for job, n in c.commands.items()), timeout=WAIT_S)
            for step in group.answers:
                command = [x for x in unique(sent, lambda x: x.decision_id) if x.job_id == step["job"]][-1]
                report = answer(step, command, from_parallelism(unique(live, lambda d: d.decision_id), command))
                send(settings, topics.runner_reports, [(command.job_id.encode(), report.to_bytes())])
            events.until(ScalingEvent.model_validate_json, lambda got, c=counts: len(
                unique(got, lambda e: e.event_id)) >= c.events, timeout=WAIT_S)
        got_letters = letters.until(DeadLetter.model_validate_json, lambda got: len(got) >= 2, timeout=WAIT_S)
        # Anything more would come within a few windows' work: give it the time, then compare all.
        decisions.poll(3.0)
        events.poll(1.0)
    finally:
        if worker is not agents:
            worker.stop()
        for collector in (decisions, commands, events, letters):
            collector.close()

    live_decisions = unique([ScalingDecision.model_validate_json(v) for _, v, _ in decisions.records],
                            lambda d: d.decision_id)
    for job in JOBS:
        ours = [comparable(d) for d in loops.decisions if d.job_id == job]
        theirs = [comparable(d) for d in live_decisions if d.job_id == job]
        assert len(theirs) == len(ours), job
        for n, (mine, live_one) in enumerate(zip(ours, theirs, strict=True)):
            assert live_one == mine, f"{job}: decision {n} (window {mine['window_end']}) differs"
    # Only the replay's jobs: an earlier test's rescale may still fail as overdue on the shared topics.
    live_events = unique([e for e in (ScalingEvent.model_validate_json(v) for _, v, _ in events.records)
                          if e.job_id in JOBS], lambda e: e.event_id)
    sim_events = [e for loop in loops.jobs.values() for e in loop.events]
    assert sorted((e.job_id, e.type.value, e.from_parallelism, e.to_parallelism) for e in live_events) == sorted(
        (e.job_id, e.type.value, e.from_parallelism, e.to_parallelism) for e in sim_events)
    got_letters = unique(got_letters, lambda letter: f"{letter.partition}:{letter.offset}")  # one per record
    assert sorted(letter.reason for letter in got_letters) == sorted(
        letter.reason for letter in loops.dead_letters) == ["malformed_json", "unknown_job"]

"""A recorded report stream of two jobs, and its replay through the simulator's loop.

The stream (tests/data/replay_stream.jsonl) was recorded from the simulator (`record`, run by
`python -m tests.support.replay`): the demo job model under each job's policy, its metric reports
and its runner's answers in order, plus bad records. `orders` runs the default planner and its load
steps up (a rescale: the job restarts, its reports stop and resume at the new parallelism);
`clicks` runs DS2 and its load drops. The replay test sends it through the live agents and through
`evaluation.loop.Loops`, window by window, and compares the decisions.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contracts.decisions import RescaleCommand, RunnerReport, RunnerStatus, ScalingDecision
from contracts.jobs import JobConfig
from contracts.messages import MetricReport
from contracts.settings import Settings
from contracts.stage import Incoming
from evaluation.forecasts import Forecaster
from evaluation.jobmodel import EPOCH
from evaluation.loop import Loops
from evaluation.model_files import demo_model
from evaluation.simulator import WINDOW_S, Completion, PolicyRunner, simulate
from evaluation.traces import Trace
from knowledge.memory import MemoryKnowledge, run_now
from plan.registry import make_policy

STREAM = Path(__file__).resolve().parent.parent / "data" / "replay_stream.jsonl"

# Per job: its overrides (registered as a user registers them), its load (rec/s per window) and the
# parallelism it starts at. The default planner forecasts with its linear fallback: no ARIMA fit is
# asked for (a fit runs in a process pool and lands when it lands, live).
JOBS: dict[str, tuple[dict[str, str], list[float], int]] = {
    "orders": ({"policy": "default", "forecast_min_points": "10000"}, [150.0] * 8 + [700.0] * 22, 1),
    "clicks": ({"policy": "ds2"}, [900.0] * 6 + [300.0] * 24, 5),
}
SEED = 7


def configs(settings: Settings) -> dict[str, JobConfig]:
    """Each job's configuration as the knowledge base makes it from its overrides."""
    knowledge = MemoryKnowledge(settings)
    return {job: run_now(knowledge.register_job(job, overrides)) for job, (overrides, _, _) in JOBS.items()}


def window_of(timestamp: float) -> int:
    return math.floor((timestamp - EPOCH) / WINDOW_S)


def record() -> list[dict[str, Any]]:
    """The stream, ordered by window: every job's reports of the window, then its runners' answers
    given in that window (the simulator applies them before deciding the window)."""
    steps: list[tuple[int, int, str, int, dict[str, Any]]] = []
    for job, config in configs(Settings()).items():
        _, rates, start = JOBS[job]
        runner = PolicyRunner(make_policy(config.policy), config, job_id=job)
        runner.loop.forecaster = Forecaster().view
        seen: list[MetricReport | Completion] = []
        simulate(Trace(job, np.asarray(rates), WINDOW_S, "replay"), demo_model(), runner, config, start,
                 config.backlog_tolerance_s * 6, seed=SEED, job_id=job, tap=seen.append)
        for n, item in enumerate(seen):
            if isinstance(item, MetricReport):
                report = {"kind": "report", "value": item.model_dump_json()}
                steps.append((window_of(item.timestamp), 0, job, n, report))
            else:
                applied = math.ceil((item.completed_at - EPOCH) / WINDOW_S) - 1
                steps.append((applied, 1, job, n, {"kind": "runner", "job": job, "running": item.running,
                                                   "downtime_s": item.downtime_s, "completed_at": item.completed_at}))
    stranger = next(json.loads(s[4]["value"]) for s in steps if s[0] == 9 and s[4]["kind"] == "report")
    bad = [{"kind": "bad", "key": "orders", "value": "{not json"},
           {"kind": "bad", "key": "nobody", "value": json.dumps(stranger | {"job_id": "nobody"})}]
    steps += [(5, 0, "orders", -1, bad[0]), (9, 0, "nobody", -1, bad[1])]
    return [step | {"window": w} for w, _, _, _, step in sorted(steps, key=lambda s: s[:4])]


@dataclass(frozen=True)
class Group:
    """One window of the stream: the records sent (key, value), then the runners' answers."""

    window: int
    records: list[tuple[bytes, bytes]]
    answers: list[dict[str, Any]]


def load(shift: float, path: Path = STREAM) -> list[Group]:
    """The stream by window, its report times moved by `shift` seconds (a multiple of a window)."""
    groups: dict[int, Group] = {}
    for line in path.read_text().splitlines():
        step = json.loads(line)
        group = groups.setdefault(step["window"], Group(step["window"], [], []))
        if step["kind"] == "report":
            report = MetricReport.model_validate_json(step["value"])
            moved = report.model_copy(update={"timestamp": report.timestamp + shift})
            group.records.append((report.job_id.encode(), moved.to_bytes()))
        elif step["kind"] == "bad":
            group.records.append((step["key"].encode(), step["value"].encode()))
        else:
            group.answers.append(step | {"completed_at": step["completed_at"] + shift})
    return [groups[w] for w in sorted(groups)]


def answer(step: dict[str, Any], command: RescaleCommand, from_parallelism: int) -> RunnerReport:
    """The runner's `completed` report for the command, as recorded."""
    return RunnerReport(
        decision_id=command.decision_id, job_id=command.job_id, status=RunnerStatus.COMPLETED,
        from_parallelism=from_parallelism, to_parallelism=command.to_parallelism,
        running_parallelism=step["running"], fencing_token=command.fencing_token, downtime_s=step["downtime_s"],
        timestamp=step["completed_at"],
    )


def comparable(decision: ScalingDecision) -> dict[str, Any]:
    """A decision without its id and its wall-clock stamps."""
    return decision.model_dump(mode="json", exclude={"decision_id", "closed_at", "timestamp"})


@dataclass
class Counts:
    """What the in-process replay had produced after one window of the stream: the live replay waits
    for as much before it sends the next window."""

    decisions: dict[str, int]
    commands: dict[str, int]
    events: int


def in_process(groups: list[Group], settings: Settings) -> tuple[Loops, list[Counts]]:
    """The stream through the simulator's loop (`evaluation.loop.Loops`), window by window."""
    loops = Loops(configs(settings), settings,
                  forecasters={job: Forecaster().view for job in JOBS})
    after: list[Counts] = []
    for group in groups:
        loops.records([Incoming(value=v, key=k, topic=settings.topics.metrics) for k, v in group.records],
                      now=time.time())
        for step in group.answers:
            loop = loops.jobs[step["job"]]
            command = loop.commands[-1]
            loops.runner_report(answer(step, command, from_parallelism(loops.decisions, command)))
        after.append(Counts(
            {job: sum(d.job_id == job for d in loops.decisions) for job in JOBS},
            {job: len(loop.commands) for job, loop in loops.jobs.items()},
            sum(len(loop.events) for loop in loops.jobs.values()),
        ))
    return loops, after


def from_parallelism(decisions: list[ScalingDecision], command: RescaleCommand) -> int:
    """The parallelism the job ran at when the command's decision was made."""
    return next(d.from_parallelism for d in decisions if d.decision_id == command.decision_id)


def main() -> None:
    STREAM.parent.mkdir(parents=True, exist_ok=True)
    steps = record()
    STREAM.write_text("".join(json.dumps(step) + "\n" for step in steps))
    print(f"wrote {len(steps)} steps to {STREAM.name}")


if __name__ == "__main__":
    main()

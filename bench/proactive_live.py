"""The demo Spark job under a replayed load, autoscaled live by a chosen policy: rescales, backlog,
and each rescale's predicted recovery time beside the one anomaly detection observed.

Starts its own broker and Redis, the four agents, the job (local Spark) and the load generator.

  python -m bench.proactive_live --policy hybrid
      steps that force rescales both ways (about 17 minutes); a table of predicted vs observed
      recovery per rescale, the median absolute error, and JSON under bench/results/
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import Consumer
from rich.console import Console
from rich.table import Table

from contracts.messages import Analysis, EventType, ScalingDecision, ScalingEvent
from contracts.settings import Settings, Topics, settings_env
from infra.kafka import ensure_topics, group_consumer_config
from knowledge import RedisKnowledge
from stack.processes import free_port, spawn, start_broker, start_redis, stop_pid, wait_for_port

JOB = "demo"
RESULTS = Path(__file__).parent / "results"
# Rescales both ways: the demo job carries about 215 rec/s per slot at cost_ms=4. Each level lasts
# longer than a restart plus a recovery, so every rescale's recovery can be observed before the next.
# At most 3 slots: on 2 cores, with the agents, broker and load generator beside it, the job at 4
# slots processes far below its busy-time capacity (see docs/results.md, "Live").
DEFAULT_STEPS = "steps:100:60,350:150,100:150,420:150,150:150,300:150,100:150"


@dataclass
class LiveRun:
    started: float
    analyses: list[Analysis] = field(default_factory=list)
    decisions: list[ScalingDecision] = field(default_factory=list)
    events: list[ScalingEvent] = field(default_factory=list)
    load_summary: dict[str, object] = field(default_factory=dict)

    def of(self, kind: EventType) -> list[ScalingEvent]:
        return [e for e in self.events if e.type is kind]

    def timeline(self) -> str:
        t0 = self.started
        lines = [(e.timestamp - t0, f"event {e.type.value} {e.from_parallelism}->{e.to_parallelism} "
                  f"downtime={e.downtime_s or ''} {e.error or ''} {json.dumps(e.numbers) if e.numbers else ''}")
                 for e in self.events]
        lines += [(a.window_end - t0, f"window p={a.parallelism} valid={a.valid} arrival={a.arrival_rate or 0:.0f} "
                   f"backlog={a.backlog} capacity={a.capacity.current if a.capacity else None} "
                   f"forecast={a.forecast.method if a.forecast else None}") for a in self.analyses]
        lines += [(d.timestamp - t0, f"decision {d.action.value} {d.from_parallelism}->{d.to_parallelism} "
                   f"[{d.reason.code}] {d.reason.message}") for d in self.decisions if d.action.value != "none"]
        return "\n".join(f"{t:7.1f} {text}" for t, text in sorted(lines))


def isolated_settings(broker_port: int, redis_port: int, topic_prefix: str, app_id: str,
                      loop_interval_s: float) -> Settings:
    """Settings for a live benchmark's own broker and Redis, with topics of its own (`<prefix>.<topic>`)."""
    return Settings(
        kafka_bootstrap=f"127.0.0.1:{broker_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0",
        topics=Topics(**{k: f"{topic_prefix}.{v}" for k, v in Topics().model_dump().items()}),
        app_id=app_id, web_port=free_port(), loop_interval_s=loop_interval_s, topic_partitions=4,
    )


async def _register(settings: Settings, job: str, overrides: dict[str, str]) -> None:
    knowledge = RedisKnowledge(settings)
    try:
        await knowledge.register_job(job, overrides)
    finally:
        await knowledge.close()


def run_live(
    settings: Settings,
    workdir: Path,
    load_args: list[str],
    job_overrides: dict[str, str],
    max_parallelism: int = 8,
    cost_ms: float = 4.0,
    drain_s: float = 40.0,
    agents_argv: list[str] | None = None,
    job: str = JOB,
) -> LiveRun:
    """Run the job under the load until the load ends plus `drain_s`; collect what was published.

    The broker and Redis of `settings` must be running."""
    import asyncio

    env = settings_env(settings)
    run = settings.topics.metrics.split(".")[0]
    input_topic, output_topic = f"{run}.demo.input", f"{run}.demo.output"
    ensure_topics(settings, extra=[input_topic, output_topic])
    asyncio.run(_register(settings, job, {"max_parallelism": str(max_parallelism), **job_overrides}))
    # From the earliest offset: the topics are this run's own, and nothing may be missed.
    follow = Consumer(group_consumer_config(settings.kafka_bootstrap, f"bench-{uuid.uuid4().hex[:8]}", "earliest"))
    follow.subscribe([settings.topics.analyses, settings.topics.decisions, settings.topics.scaling_events])
    py = sys.executable
    agents = spawn("agents", agents_argv or [py, "-m", "agent", "agents"], workdir / "agents.log", env)
    wait_for_port("127.0.0.1", settings.web_port, timeout=90)
    runner = spawn("runner", [
        py, "-m", "agent", "job", "run", "--job-id", job, "--checkpoint-dir", str(workdir / "job"),
        "--parallelism", "1", "--max-parallelism", str(max_parallelism), "--option", f"cost_ms={cost_ms}",
        "--option", f"input_topic={input_topic}", "--option", f"output_topic={output_topic}",
    ], workdir / "runner.log", env)
    load = spawn("load", [py, "-m", "agent", "load", "run", *load_args, "--topic", input_topic, "--partitions", "4",
                          "--bootstrap", settings.kafka_bootstrap], workdir / "load.log", env)
    result = LiveRun(started=time.time())
    parsers = {settings.topics.analyses: (Analysis, result.analyses),
               settings.topics.decisions: (ScalingDecision, result.decisions),
               settings.topics.scaling_events: (ScalingEvent, result.events)}
    seen: set[tuple[str, int, int]] = set()
    try:
        drain_until = None
        while drain_until is None or time.time() < drain_until:
            msg = follow.poll(0.2)
            if msg is not None and not msg.error() and msg.topic() in parsers:
                model, into = parsers[msg.topic()]
                item = model.model_validate_json(msg.value())
                # A consumer that rejoins its group reads again from its last commit: keep each once.
                key = (msg.topic(), msg.partition(), msg.offset())
                if item.job_id == job and key not in seen:
                    seen.add(key)
                    into.append(item)  # type: ignore[arg-type]
            if drain_until is None and load.poll() is not None:
                drain_until = time.time() + drain_s
        lines = (workdir / "load.log").read_text().strip().splitlines()
        if lines:
            try:
                result.load_summary = json.loads(lines[-1])
            except json.JSONDecodeError:
                result.load_summary = {"tail": lines[-1]}
    finally:
        for process in (load, runner, agents):
            stop_pid(process.pid, timeout=60, process=process)
        follow.close()
    return result


def recovery_rows(run: LiveRun) -> list[dict[str, float | int | None]]:
    rows = []
    for e in run.of(EventType.RECOVERED):
        rows.append({"at_s": round(e.timestamp - run.started, 1), "from": e.from_parallelism, "to": e.to_parallelism,
                     "predicted_s": e.numbers.get("predicted_s"), "observed_s": e.numbers.get("observed_s"),
                     "error_s": e.numbers.get("error_s")})
    return rows


app = typer.Typer(help=__doc__, no_args_is_help=False)


@app.command()
def main(
    policy: Annotated[str, typer.Option(help="ds2, daedalus or hybrid.")] = "hybrid",
    shape: Annotated[str, typer.Option(help="Load shape (see `autoscaler load run --help`).")] = DEFAULT_STEPS,
    cost_ms: Annotated[float, typer.Option(help="The demo job's CPU cost per record.")] = 4.0,
    json_out: Annotated[Path | None, typer.Option(help="Default bench/results/proactive_live-<policy>.json")] = None,
) -> None:
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="proactive-live-"))
    broker, redis = start_broker(log_path=workdir / "broker.log"), start_redis(log_path=workdir / "redis.log")
    run_id = uuid.uuid4().hex[:6]
    settings = isolated_settings(broker.port, redis.port, f"b{run_id}", f"bench-{run_id}", loop_interval_s=5.0)
    overrides = {"policy": policy, "restart_time_s": "20", "scale_down_delay_s": "20", "target_recovery_s": "60",
                 "forecast_horizon_s": "60", "forecast_min_points": "20", "checkpoint_interval_s": "5"}
    started = time.time()
    try:
        run = run_live(settings, workdir, ["--shape", shape], overrides, max_parallelism=3, cost_ms=cost_ms)
    finally:
        stop_pid(broker.process.pid, process=broker.process)
        stop_pid(redis.process.pid, process=redis.process)
    rows = recovery_rows(run)
    table = Table(title=f"Recovery after each live rescale of the demo job (policy {policy}, {shape})")
    for column in ("at s", "rescale", "predicted s", "observed s", "error s"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r['at_s']:.0f}", f"{r['from']} -> {r['to']}",
                      "-" if r["predicted_s"] is None else f"{r['predicted_s']:.1f}",
                      f"{r['observed_s']:.1f}", "-" if r["error_s"] is None else f"{r['error_s']:+.1f}")
    console.print(table)
    errors = [abs(float(r["error_s"])) for r in rows if r["error_s"] is not None]
    completed = run.of(EventType.COMPLETED)
    summary = {
        "policy": policy, "shape": shape, "cost_ms": cost_ms, "wall_s": round(time.time() - started, 1),
        "rescales_completed": len(completed), "rescales_failed": len(run.of(EventType.FAILED)),
        "recoveries_observed": len(rows), "recoveries_with_prediction": len(errors),
        "median_abs_error_s": statistics.median(errors) if errors else None,
        "max_backlog": max((a.backlog or 0 for a in run.analyses), default=None),
        "downtimes_s": [e.downtime_s for e in completed], "recoveries": rows, "load": run.load_summary,
    }
    console.print(f"rescales completed {len(completed)}, recoveries observed {len(rows)} "
                  f"({len(errors)} with a prediction); median |predicted - observed| "
                  f"{summary['median_abs_error_s']} s; wall {summary['wall_s']} s")
    out = json_out or RESULTS / f"proactive_live-{policy}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    (workdir / "timeline.txt").write_text(run.timeline())
    console.print(f"wrote {out}; timeline in {workdir / 'timeline.txt'}")


if __name__ == "__main__":
    app()

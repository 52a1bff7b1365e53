"""`autoscaler demo`: the demo Spark job under changing load, autoscaled live on the embedded stack."""

from __future__ import annotations

import shutil
import time

from confluent_kafka import KafkaError
from rich.console import Console

from agent.watch import consumer, describe_decision, describe_event
from contracts.messages import Analysis, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import ensure_topics
from stack.embedded import Stack, state_dir
from stack.processes import stop_pid
from stack.services import register_jobs, start_job_runner, start_load

JOB = "demo"


def run_demo(
    settings: Settings, shape: str, cost_ms: float, partitions: int, max_parallelism: int, fresh: bool,
    console: Console,
) -> None:
    stack = Stack(settings)
    started_stack = not all(stack.status().values())
    stack.up(console=console)
    ensure_topics(settings, extra=["demo.input", "demo.output"])
    # The demo compresses time: its low phase is shorter than the default 300 s scale-down delay.
    register_jobs(settings, [JOB], max_parallelism=str(max_parallelism), mode="auto", scale_down_delay_s="60")
    job_dir = state_dir() / "demo"
    if fresh and job_dir.exists():
        shutil.rmtree(job_dir)
    logs = state_dir() / "logs"
    runner = start_job_runner(settings, JOB, job_dir, logs / "runner.log", max_parallelism=max_parallelism,
                              options={"cost_ms": str(cost_ms)})
    load = start_load(settings, "demo.input", logs / "load.log", ["--shape", shape], partitions=partitions)
    console.print(f"demo job started (runner pid {runner.pid}); load: {shape}; logs in {logs}")
    console.print("decisions, rescales and one status line per window follow; Ctrl-C stops the demo\n")
    follow = consumer(settings, [settings.topics.decisions, settings.topics.scaling_events, settings.topics.analyses])
    try:
        while load.poll() is None:
            if runner.poll() is not None:
                console.print(f"[red]the job runner exited ({runner.returncode}); see {logs / 'runner.log'}[/red]")
                break
            msg = follow.poll(0.5)
            if msg is None or (msg.error() and msg.error().code() != KafkaError._PARTITION_EOF):
                continue
            if msg.topic() == settings.topics.analyses:
                a = Analysis.model_validate_json(msg.value())
                if a.job_id == JOB:
                    console.print(
                        f"{time.strftime('%H:%M:%S')} parallelism {a.parallelism}, arrival "
                        f"{a.arrival_rate or 0:.0f} rec/s, processed {a.observed_processing_rate:.0f} rec/s, "
                        f"backlog {a.backlog or 0}, utilization {a.utilization:.0%}, "
                        f"true rate {a.true_processing_rate:.0f} rec/s per slot", style="dim")
            elif msg.topic() == settings.topics.decisions:
                d = ScalingDecision.model_validate_json(msg.value())
                if d.job_id == JOB and d.action.value != "none":
                    console.print(describe_decision(d))
            else:
                console.print(describe_event(ScalingEvent.model_validate_json(msg.value())))
        console.print("load finished")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        follow.close()
        for process in (load, runner):
            stop_pid(process.pid, timeout=60, process=process)
        if started_stack:
            stack.down(console=console)

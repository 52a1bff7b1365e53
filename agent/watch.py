"""Follow the decisions and scaling-events topics and print them as they arrive."""

from __future__ import annotations

import datetime as dt
import time
import uuid

from confluent_kafka import Consumer
from rich.console import Console

from contracts.messages import ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import group_consumer_config


def consumer(settings: Settings, topics: list[str], group: str | None = None) -> Consumer:
    c = Consumer(group_consumer_config(
        settings, group or f"autoscaler-watch-{uuid.uuid4().hex[:8]}", "latest"
    ))
    c.subscribe(topics)
    return c


def describe_decision(d: ScalingDecision) -> str:
    when = dt.datetime.fromtimestamp(d.timestamp).strftime("%H:%M:%S")
    return (f"{when} [bold]{d.job_id}[/bold] decision {d.action.value}: {d.from_parallelism} -> "
            f"{d.to_parallelism} [{d.reason.code}] {d.reason.message}")


def describe_event(e: ScalingEvent) -> str:
    when = dt.datetime.fromtimestamp(e.timestamp).strftime("%H:%M:%S")
    extra = ""
    if e.downtime_s is not None:
        extra += f", downtime {e.downtime_s:.1f} s"
    if e.error:
        extra += f", error: {e.error}"
    if e.detail and e.type.value != "started":
        extra += f", {e.detail}"
    return f"{when} [bold]{e.job_id}[/bold] rescale {e.type.value}: {e.from_parallelism} -> {e.to_parallelism}{extra}"


def watch_topics(settings: Settings, seconds: float, all_decisions: bool, console: Console) -> None:
    c = consumer(settings, [settings.topics.decisions, settings.topics.scaling_events])
    deadline = time.monotonic() + seconds if seconds else float("inf")
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            if msg.topic() == settings.topics.decisions:
                decision = ScalingDecision.model_validate_json(msg.value())
                if all_decisions or decision.action.value != "none":
                    console.print(describe_decision(decision))
            else:
                console.print(describe_event(ScalingEvent.model_validate_json(msg.value())))
    except KeyboardInterrupt:
        pass
    finally:
        c.close()

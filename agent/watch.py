"""Follow the decisions and scaling-events topics and print them as they arrive, each once.

Decisions and events are published at least once (a worker's crash can publish one again, same id);
`infra.subscribe.Subscriber` drops the repeats by `decision_id` and `event_id`."""

from __future__ import annotations

import datetime as dt
import uuid

from confluent_kafka import Consumer
from rich.console import Console

from contracts.decisions import ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import group_consumer_config
from infra.subscribe import Subscriber


def consumer(settings: Settings, topics: list[str], group: str | None = None) -> Consumer:
    """A raw consumer of `topics` from their newest messages (the demo's, which also reads analyses)."""
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


def watch_topics(settings: Settings, seconds: float, all_decisions: bool, console: Console, *,
                 as_json: bool = False, from_beginning: bool = False) -> None:
    """Print each decision (`all_decisions`: also those whose action is none) and event once, for
    `seconds` (0: until Ctrl-C); `as_json`: one message a line, as published."""
    with Subscriber(settings, from_beginning=from_beginning) as subscriber:
        try:
            for message in subscriber.messages(seconds):
                if isinstance(message, ScalingDecision) and not all_decisions and message.action.value == "none":
                    continue
                if as_json:
                    console.print(message.model_dump_json(), markup=False, highlight=False, soft_wrap=True)
                elif isinstance(message, ScalingDecision):
                    console.print(describe_decision(message))
                else:
                    console.print(describe_event(message))
        except KeyboardInterrupt:
            pass

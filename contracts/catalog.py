"""Every topic's contract by name, and its JSON Schema."""

from __future__ import annotations

import json
from typing import Any

from contracts.dead_letters import DeadLetter
from contracts.messages import (
    Analysis,
    Contract,
    MetricReport,
    MetricWindow,
    RescaleCommand,
    RunnerReport,
    ScalingDecision,
    ScalingEvent,
)

CONTRACTS: dict[str, type[Contract]] = {
    "metric-report": MetricReport,
    "metric-window": MetricWindow,
    "analysis": Analysis,
    "scaling-decision": ScalingDecision,
    "rescale-command": RescaleCommand,
    "runner-report": RunnerReport,
    "scaling-event": ScalingEvent,
    "dead-letter": DeadLetter,
}


def json_schema(name: str) -> dict[str, Any]:
    try:
        model = CONTRACTS[name]
    except KeyError:
        raise KeyError(f"unknown contract {name!r}; known: {', '.join(sorted(CONTRACTS))}") from None
    return model.model_json_schema()


def json_schema_text(name: str) -> str:
    return json.dumps(json_schema(name), indent=2, sort_keys=True)

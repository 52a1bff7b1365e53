"""Every topic's contract by name, and its JSON Schema."""

from __future__ import annotations

import json
from enum import Enum
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from contracts.analyses import Analysis
from contracts.dead_letters import DeadLetter
from contracts.decisions import RescaleCommand, RunnerReport, ScalingDecision, ScalingEvent
from contracts.messages import Contract, MetricReport, MetricWindow

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


# Every topic, its contract, who writes and who reads it.
TOPICS: dict[str, tuple[str, str]] = {
    "metrics": ("metric-report", "the job's reporter -> monitor"),
    "windows": ("metric-window", "monitor -> analyze"),
    "analyses": ("analysis", "analyze -> plan"),
    "decisions": ("scaling-decision", "plan -> execute, and you"),
    "commands": ("rescale-command", "execute -> the job runner"),
    "runner_reports": ("runner-report", "the job runner -> execute"),
    "scaling_events": ("scaling-event", "execute -> you"),
    "dead_letter": ("dead-letter", "monitor and analyze -> you"),
}


def _constraints(metadata: list[Any]) -> str:
    """The bounds a field's metadata puts on its value, e.g. `>= 0`, `<= 3600`."""
    shown = []
    for item in metadata:
        if isinstance(getattr(item, "metadata", None), list):  # a Field(...) inside Annotated
            inner = _constraints(item.metadata)
            shown += [inner] if inner else []
            continue
        for attribute, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("max_length", "length <=")):
            value = getattr(item, attribute, None)
            if value is not None:
                shown.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value:g}")
    return ", ".join(shown)


def _type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `float >= 0`, `SourceMetrics | None`, `list[str]`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        bounds = _constraints(list(args[1:]))
        return _type_name(args[0]) + (f" ({bounds})" if bounds else "")
    if origin in (Union, UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(arg) for arg in args)}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _nested(annotation: Any) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for arg in get_args(annotation):
        found += _nested(arg)
    return found


def _plain(value: object) -> object:
    """An enum default as its value, the way it appears in JSON."""
    return value.value if isinstance(value, Enum) else value


def contracts_markdown() -> str:
    """docs/contracts.md: every topic's contract, field by field, from the models themselves."""
    from contracts.settings import Topics

    topics = Topics()
    lines = ["# Topic contracts", "",
             "Generated from the pydantic models (`autoscaler schema --write docs/schemas` writes this page and the",
             "JSON Schemas beside it); a test fails when it is stale. All messages are JSON, keyed by the job id so",
             "that one job's messages stay in order; times are epoch seconds; a consumer refuses a `schema_version`",
             "it does not know.", "",
             "| topic (default name) | contract | from -> to | JSON Schema |", "|---|---|---|---|"]
    for field_name, (contract, flow) in TOPICS.items():
        lines.append(f"| `{getattr(topics, field_name)}` | [{contract}](#{contract}) | {flow} | "
                     f"[{contract}.schema.json](schemas/{contract}.schema.json) |")
    queue: list[tuple[str, type[BaseModel]]] = list(CONTRACTS.items())
    seen: set[type[BaseModel]] = set()
    while queue:
        title, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        doc = " ".join((model.__doc__ or "").split())
        lines += ["", f"## {title}", "", doc, "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else (
                "(generated)" if field.default_factory is not None else f"`{_plain(field.default)!r}`")
            meaning = " ".join((field.description or "").split()).replace("|", "\\|")
            bounds = _constraints(field.metadata)
            kind = (_type_name(field.annotation) + (f" ({bounds})" if bounds else "")).replace("|", "\\|")
            lines.append(f"| `{field.alias or name}` | {kind} | {default} | {meaning} |")
            queue += [(nested.__name__, nested) for nested in _nested(field.annotation) if nested not in seen]
    return "\n".join(lines) + "\n"

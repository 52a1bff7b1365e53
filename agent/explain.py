"""`autoscaler explain`: why a job runs at its parallelism, from the decisions kept in knowledge.

Pure: records in (newest first, as knowledge returns them), a table and a summary out.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from rich.table import Table

# Numbers worth a column in the table, in this order, when a decision carries them.
KEY_NUMBERS = ("arrival_rate", "backlog", "true_processing_rate_per_slot", "implied_utilization", "target_rate",
               "planned_rate_now", "capacity_at_target", "plan_cost_slot_s", "alternative_first",
               "alternative_cost_slot_s")


def is_suppression(decision: dict[str, Any]) -> bool:
    """A window where the policy (or a control) wanted another parallelism, but none was decided."""
    recommended = decision.get("recommended_parallelism")
    return decision["action"] == "none" and recommended is not None and recommended != decision["from_parallelism"]


def clock(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%H:%M:%S")


def numbers_text(decision: dict[str, Any]) -> str:
    numbers = decision["reason"].get("numbers") or {}
    parts = []
    for name in KEY_NUMBERS:
        value = numbers.get(name)
        if value is not None:
            parts.append(f"{name}={value:.3g}" if isinstance(value, float) else f"{name}={value}")
    return " ".join(parts)


def decision_table(decisions: list[dict[str, Any]], only_changes: bool = False) -> Table:
    table = Table("window end (UTC)", "action", "from", "to", "recommended", "rule", "reason", "why", "numbers",
                  title="Decisions, newest first")
    for d in decisions:
        if only_changes and d["action"] == "none" and not is_suppression(d):
            continue
        style = "bold" if d["action"] != "none" else ("yellow" if is_suppression(d) else "dim")
        recommended = d.get("recommended_parallelism")
        table.add_row(
            clock(d["window_end"]), d["action"], str(d["from_parallelism"]), str(d["to_parallelism"]),
            "" if recommended is None else str(recommended), d["reason"].get("rule", ""), d["reason"]["code"],
            d["reason"]["message"], numbers_text(d), style=style,
        )
    return table


def summary(decisions: list[dict[str, Any]]) -> list[str]:
    """The last action and why, what was suppressed before it (back to the action before), and
    what has been suppressed since."""
    if not decisions:
        return ["no decisions recorded for this job yet"]
    lines: list[str] = []
    actions = [i for i, d in enumerate(decisions) if d["action"] != "none"]
    latest = decisions[0]
    lines.append(f"latest window ({clock(latest['window_end'])}): {latest['reason']['code']}: "
                 f"{latest['reason']['message']}")
    if not actions:
        lines.append(f"no scaling action among the last {len(decisions)} decisions")
        since = decisions
    else:
        last = decisions[actions[0]]
        lines.append(
            f"last action: {last['action']} {last['from_parallelism']} -> {last['to_parallelism']} at "
            f"{clock(last['window_end'])} ({last['reason'].get('rule', '')}/{last['reason']['code']}): "
            f"{last['reason']['message']}"
        )
        previous = actions[1] if len(actions) > 1 else len(decisions)
        before = [d for d in decisions[actions[0] + 1:previous] if is_suppression(d)]
        lines.append(_suppressed("suppressed before it", before))
        since = decisions[:actions[0]]
    lines.append(_suppressed("suppressed since", [d for d in since if is_suppression(d)]))
    return lines


def _suppressed(label: str, held: list[dict[str, Any]]) -> str:
    if not held:
        return f"{label}: nothing"
    counts = Counter(d["reason"]["code"] for d in held)
    wanted = sorted({d["recommended_parallelism"] for d in held})
    return f"{label}: {len(held)} window(s) wanting {wanted}: " + ", ".join(
        f"{code} x{n}" for code, n in counts.most_common()
    )

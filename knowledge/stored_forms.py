"""Older stored forms, read as the current ones: the one place a stored value's migration lives.

The knowledge base's read path calls these, so the stages' cores only ever see the current form.
(The monitor's open window reads its older forms in `contracts.window_state.WindowState.from_dict`,
the rescale in flight in `knowledge.redis_execution.load_inflight`, the plan state in
`contracts.plan_state.PlanState.load`.)
"""

from __future__ import annotations

from typing import Any


def learned(data: dict[str, Any]) -> dict[str, Any]:
    """Analyze's learned state (`analyze.learning.Learned.to_dict`) in its current form. Fields kept
    since a later version are absent in what an earlier one stored: the previous window's backlog and
    report time (`last_backlog`, `last_report_at`), and the recovery detector's last point
    (`detector.last_excess`): none then."""
    current = {"last_backlog": None, "last_report_at": None, **data}
    if isinstance(data.get("detector"), dict):
        current["detector"] = {"last_excess": None, **data["detector"]}
    return current

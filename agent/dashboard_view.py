"""What the dashboard shows, computed from knowledge's records: pure functions, no I/O.

Records come as knowledge returns them (newest first); charts go out oldest first, each chart's
series aligned on one time axis (uPlot's data layout: `x` and one list per series, `None` where a
series has no point)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from agent.explain import clock, is_suppression, numbers_text
from contracts.analyses import records_beyond_target
from plan.forecast_skill import LEAD_S, MAX_ERROR, MIN_SCORES
from plan.policies.default import (
    FORECAST_MAX_OFFSET,
    CostPlanner,
    PlannerMemory,
    capped_upper,
    forecast_offset,
)

# A job whose last analysis is older than this many windows (and at least a minute) is stale.
STALE_WINDOWS = 3
# The forecast drawn ahead of the last window: at least this long, else half the history's span.
FORECAST_SHOWN_MIN_S = 120.0
# The rates chart's y axis: up to this much above the largest measured rate (arrivals, processed,
# capacity); a forecast above it is clipped at the top edge, not allowed to squeeze the measured series.
RATES_HEADROOM = 1.1


@dataclass(frozen=True)
class ForecastTrust:
    """Whether the job's planner plans with analyze's forecast (`trusted`), how far above the point
    forecast it takes the upper band (`band`, a log ratio), the level it applies the forecast's change to
    (`level`), and why, in words."""

    trusted: bool
    band: float
    level: float | None
    why: str


def forecast_trust(policy: str, policy_state: dict[str, Any]) -> ForecastTrust | None:
    """The default policy's trust in the forecast, read from its memory in the plan state
    (`plan.forecast_skill`: trusted while its predicted 10-minute changes came true); None for a policy
    that does not score the forecast (it plans with it as it comes, or not at all)."""
    if policy != CostPlanner.name:
        return None
    try:
        memory = PlannerMemory.model_validate(policy_state) if policy_state else PlannerMemory()
    except ValidationError:
        return ForecastTrust(False, 0.0, None, "not trusted: the planner's memory is not readable")
    skill, minutes = memory.skill, LEAD_S / 60
    median = skill.median_error()
    if median is None:
        return ForecastTrust(False, skill.band(), memory.level.level(),
                             f"not trusted yet: its {minutes:.0f}-minute change was checked {len(skill.errors)} "
                             f"of {MIN_SCORES} times since the load last shifted; the planner plans with the "
                             "measured level")
    if not skill.trusted():
        return ForecastTrust(False, skill.band(), memory.level.level(),
                             f"not trusted: its {minutes:.0f}-minute changes missed by {math.expm1(median):.0%} "
                             f"(median; trusted within {math.expm1(MAX_ERROR):.0%}); the planner plans with the "
                             "measured level")
    return ForecastTrust(True, skill.band(), memory.level.level(),
                         f"trusted: its {minutes:.0f}-minute changes came true within {math.expm1(median):.0%} "
                         f"(median); upper band capped at +{math.expm1(skill.band()):.0%}, as the planner uses it")


def health(last_analysis: dict[str, Any] | None, last_event: dict[str, Any] | None, backlog_target_s: float,
           window_s: float, now: float) -> str:
    """One word for the job list: no data, stale, rescale failed, behind (backlog over its target), ok."""
    if last_analysis is None:
        return "no data"
    if now - float(last_analysis.get("closed_at") or 0.0) > max(60.0, STALE_WINDOWS * window_s):
        return "stale"
    if last_event is not None and last_event.get("type") == "failed":
        return "rescale failed"
    backlog, arrival = last_analysis.get("backlog"), last_analysis.get("arrival_rate")
    if backlog is not None and arrival is not None and records_beyond_target(backlog, arrival, backlog_target_s) > 0:
        return "behind"
    return "ok"


def decision_detail(decision: dict[str, Any]) -> dict[str, Any]:
    """A decision as `autoscaler explain` prints a row of its table."""
    reason = decision.get("reason") or {}
    return {
        "t": decision["window_end"], "clock": clock(decision["window_end"]), "action": decision["action"],
        "from": decision["from_parallelism"], "to": decision["to_parallelism"],
        "recommended": decision.get("recommended_parallelism"), "rule": reason.get("rule", ""),
        "code": reason.get("code", ""), "message": reason.get("message", ""), "numbers": numbers_text(decision),
        "suppressed": is_suppression(decision),
    }


def job_summary(job_id: str, config: dict[str, Any], parallelism: int | None, last_analysis: dict[str, Any] | None,
                last_decision: dict[str, Any] | None, last_event: dict[str, Any] | None, window_s: float,
                now: float) -> dict[str, Any]:
    """A row of the job list."""
    running = parallelism if parallelism is not None else (last_analysis or {}).get("parallelism")
    return {
        "job_id": job_id, "mode": config["mode"], "policy": config["policy"], "parallelism": running,
        "last_decision": None if last_decision is None else decision_detail(last_decision),
        "health": health(last_analysis, last_event, config["backlog_target_s"], window_s, now),
    }


def _aligned(columns: dict[str, dict[float, float | None]]) -> dict[str, list[Any]]:
    """Series keyed by time, on the union of their times, oldest first."""
    times = sorted({t for points in columns.values() for t in points})
    return {"x": times, **{name: [points.get(t) for t in times] for name, points in columns.items()}}


def _capacity(analysis: dict[str, Any]) -> float | None:
    capacity = analysis.get("capacity") or {}
    return capacity.get("current")


def _points_until(points: list[float], start: float, step: float, until: float) -> dict[float, float]:
    return {start + i * step: float(v) for i, v in enumerate(points) if start + i * step <= until}


def _forecast(analyses: list[dict[str, Any]], trust: ForecastTrust | None
              ) -> tuple[dict[str, dict[float, float]], str | None]:
    """The newest forecast, ahead of its window (at most half the history's span ahead of the last window,
    and at least two minutes, so the history stays readable beside it), as the planner uses it:
    `forecast` and `forecast_upper` (capped at the trusted band) when it plans with it, else the point
    forecast alone as `forecast_untrusted`; and a note saying which and why."""
    shown: dict[str, dict[float, float]] = {"forecast": {}, "forecast_upper": {}, "forecast_untrusted": {}}
    newest = next((a for a in analyses if (a.get("forecast") or {}).get("values")), None)
    if newest is None:
        return shown, None
    span = float(analyses[0]["window_end"]) - float(analyses[-1]["window_end"])
    until = float(analyses[0]["window_end"]) + max(span / 2, FORECAST_SHOWN_MIN_S)
    forecast = newest["forecast"]
    start, step = float(forecast["start"]), float(forecast["step_s"])
    values = [float(v) for v in forecast["values"]]
    upper = [float(v) for v in forecast.get("upper") or []]
    note = None
    if trust is not None:
        note = f"forecast ({forecast.get('method', '?')}) {trust.why}"
        offset = forecast_offset(trust.level, values[0])
        if trust.trusted and offset > FORECAST_MAX_OFFSET:
            trust, note = None, (f"forecast ({forecast.get('method', '?')}) not used: it starts {offset:.0%} from "
                                 f"the measured level (used within {FORECAST_MAX_OFFSET:.0%})")
        elif trust.trusted and len(upper) == len(values):
            upper = capped_upper(np.asarray(values), upper, trust.band).tolist()
        if trust is None or not trust.trusted:
            shown["forecast_untrusted"] = _points_until(values, start, step, until)
            return shown, note
    shown["forecast"] = _points_until(values, start, step, until)
    shown["forecast_upper"] = _points_until(upper, start, step, until)
    return shown, note


def _rates_range(rates: dict[str, list[Any]]) -> list[float] | None:
    """The rates chart's y axis: from 0 to a little above the measured series (arrivals, processed,
    capacity), whatever the forecast does; None before any."""
    measured = [v for name in ("arrival", "processed", "capacity") for v in rates[name] if v is not None]
    top = max(measured, default=0.0)
    return [0.0, top * RATES_HEADROOM] if top > 0 else None


def job_series(analyses: list[dict[str, Any]], decisions: list[dict[str, Any]],
               backlog_target_s: float, trust: ForecastTrust | None = None) -> dict[str, Any]:
    """Every chart of a job's page, from its analyses and decisions (both newest first); `trust`: the
    planner's trust in the forecast (`forecast_trust`), None for a policy that does not score it."""
    oldest_first = list(reversed(analyses))

    def column(read: Any) -> dict[float, float | None]:
        return {float(a["window_end"]): read(a) for a in oldest_first}

    forecast, note = _forecast(analyses, trust)
    rates = _aligned({
        "arrival": column(lambda a: a.get("arrival_rate")),
        "processed": column(lambda a: a.get("observed_processing_rate")),
        "capacity": column(_capacity),
        **forecast,
    })
    marked = [d for d in reversed(decisions) if d["action"] != "none" or is_suppression(d)]
    parallelism = _aligned({
        "parallelism": column(lambda a: a.get("parallelism")),
        "decisions": {float(d["window_end"]): d.get("recommended_parallelism") or d["to_parallelism"] for d in marked},
    })
    backlog = _aligned({
        "backlog": column(lambda a: a.get("backlog")),
        "target": column(lambda a: None if a.get("arrival_rate") is None else backlog_target_s * a["arrival_rate"]),
    })
    predicted = {float(d["window_end"]): (d.get("reason") or {}).get("numbers", {}).get("predicted_recovery_s")
                 for d in marked if d["action"] != "none"}
    observed = {float(a["recovery"]["started_at"]): a["recovery"]["observed_s"]
                for a in oldest_first if a.get("recovery")}
    recovery = _aligned({"predicted": {t: v for t, v in predicted.items() if v is not None}, "observed": observed})
    return {
        "rates": rates, "rates_range": _rates_range(rates), "forecast_note": note,
        "parallelism": parallelism, "backlog": backlog, "recovery": recovery,
        "markers": {f"{float(d['window_end']):.3f}": decision_detail(d) for d in marked},
        "decisions": [decision_detail(d) for d in decisions[:20]],
        "windows": len(analyses),
        "last_window_end": analyses[0]["window_end"] if analyses else None,
    }


def page_of(job_ids: Iterable[str], query: str, page: int, size: int) -> tuple[list[str], int]:
    """The sorted job ids that contain `query` (case-insensitive), the `page`-th slice (from 1), and the total."""
    needle = query.strip().lower()
    matching = sorted(job for job in job_ids if needle in job.lower())
    start = (max(page, 1) - 1) * size
    return matching[start:start + size], len(matching)

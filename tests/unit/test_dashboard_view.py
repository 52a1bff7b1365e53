"""The dashboard's pure view: job rows, health, aligned chart series, decision marks, paging."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.dashboard_view import (
    ForecastTrust,
    decision_detail,
    forecast_trust,
    health,
    job_series,
    job_summary,
    page_of,
)
from plan.forecast_skill import ForecastSkill
from plan.level import LevelState
from plan.policies.default import PlannerMemory

NOW = 10_000.0


def analysis(t: float, **fields: Any) -> dict[str, Any]:
    return {"window_end": t, "parallelism": 2, "arrival_rate": 100.0, "observed_processing_rate": 90.0,
            "backlog": 50, "valid": True, "closed_at": NOW, **fields}


def decision(t: float, action: str = "none", to: int = 2, recommended: int | None = None,
             **numbers: float) -> dict[str, Any]:
    return {"decision_id": f"d{t}", "window_end": t, "action": action, "from_parallelism": 2, "to_parallelism": to,
            "recommended_parallelism": recommended,
            "reason": {"code": "ds2_optimal", "rule": "ds2", "message": "why", "numbers": numbers}}


def test_health_names_the_worst_thing_first() -> None:
    assert health(None, None, 60.0, 10.0, NOW) == "no data"
    assert health(analysis(1.0, closed_at=NOW - 61), None, 60.0, 10.0, NOW) == "stale"
    assert health(analysis(1.0, closed_at=NOW - 50), None, 60.0, 10.0, NOW) == "ok"  # within a minute
    assert health(analysis(1.0), {"type": "failed"}, 60.0, 10.0, NOW) == "rescale failed"
    assert health(analysis(1.0, backlog=6001), None, 60.0, 10.0, NOW) == "behind"  # 60 s x 100 rec/s = 6,000
    assert health(analysis(1.0, backlog=6000), {"type": "completed"}, 60.0, 10.0, NOW) == "ok"


def test_series_are_oldest_first_and_aligned_with_the_forecast_ahead() -> None:
    forecast = {"values": [120.0, 130.0], "upper": [140.0, 150.0], "start": 40.0, "step_s": 10.0, "method": "arima"}
    analyses = [analysis(30.0, capacity={"current": 200.0}, forecast=forecast), analysis(20.0), analysis(10.0)]
    series = job_series(analyses, [decision(30.0), decision(20.0, "scale_up", 4, predicted_recovery_s=25.0)], 60.0)
    rates = series["rates"]
    assert rates["x"] == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert rates["arrival"] == [100.0, 100.0, 100.0, None, None]
    assert rates["capacity"] == [None, None, 200.0, None, None]
    assert rates["forecast"] == [None, None, None, 120.0, 130.0]
    assert rates["forecast_upper"][-1] == 150.0
    assert series["backlog"]["target"] == [6000.0] * 3
    assert series["parallelism"]["decisions"] == [None, 4, None]  # only the action is marked
    assert list(series["markers"]) == ["20.000"]
    assert series["recovery"] == {"x": [20.0], "predicted": [25.0], "observed": [None]}
    assert series["windows"] == 3 and series["last_window_end"] == 30.0
    assert [d["t"] for d in series["decisions"]] == [30.0, 20.0]


def test_a_suppressed_decision_is_marked_at_what_was_wanted() -> None:
    held = decision(10.0, "none", 2, recommended=5)
    series = job_series([analysis(10.0)], [held], 60.0)
    assert series["parallelism"]["decisions"] == [5]
    assert series["markers"]["10.000"]["suppressed"] is True


def test_observed_recovery_is_placed_when_it_started() -> None:
    recovered = analysis(90.0, recovery={"started_at": 40.0, "observed_s": 35.0, "judge": "statistical",
                                         "from_parallelism": 2, "to_parallelism": 4})
    series = job_series([recovered], [], 60.0)
    assert series["recovery"] == {"x": [40.0], "predicted": [None], "observed": [35.0]}


def test_detail_reads_as_explain_does() -> None:
    detail = decision_detail(decision(3600.0, "scale_up", 4, arrival_rate=1234.5678, backlog=10))
    assert detail["clock"] == "01:00:00"
    assert detail["numbers"] == "arrival_rate=1.23e+03 backlog=10"
    assert (detail["from"], detail["to"], detail["rule"], detail["code"]) == (2, 4, "ds2", "ds2_optimal")


def test_summary_prefers_the_runners_parallelism() -> None:
    config = {"mode": "auto", "policy": "default", "backlog_target_s": 60.0}
    row = job_summary("j", config, 3, analysis(10.0), decision(10.0), None, 10.0, NOW)
    assert row["parallelism"] == 3 and row["health"] == "ok" and row["last_decision"]["code"] == "ds2_optimal"
    assert job_summary("j", config, None, analysis(10.0), None, None, 10.0, NOW)["parallelism"] == 2


@given(st.sets(st.text(alphabet="abcxyz-0123", min_size=1, max_size=8), max_size=60),
       st.text(alphabet="abc", max_size=2), st.integers(1, 20))
def test_pages_cover_every_match_once_in_order(jobs: set[str], query: str, size: int) -> None:
    seen: list[str] = []
    page = 1
    while True:
        rows, total = page_of(jobs, query, page, size)
        if not rows:
            break
        seen += rows
        page += 1
    assert seen == sorted(j for j in jobs if query.lower() in j.lower())
    assert total == len(seen)


def test_the_forecast_is_drawn_half_the_history_ahead_at_least_two_minutes() -> None:
    forecast = {"values": [1.0] * 400, "start": 0.0, "step_s": 10.0, "method": "linear_trend"}
    short = job_series([analysis(0.0, forecast=forecast)], [], 60.0)["rates"]
    assert max(t for t, v in zip(short["x"], short["forecast"], strict=True) if v is not None) == 120.0
    history = [analysis(float(t), forecast=forecast if t == 1800 else None) for t in range(1800, -10, -10)]
    long = job_series(history, [], 60.0)["rates"]
    assert long["x"][-1] == 1800.0 + 900.0  # the history spans 1,800 s
    assert long["forecast_upper"] == [None] * len(long["x"])  # no band in this forecast


def test_the_job_route_answers_the_same_row_as_the_list_and_unchanged_when_nothing_is_new() -> None:
    """The routes' handlers on the in-memory knowledge (the browser test runs them over HTTP on Redis)."""
    import asyncio
    import json
    from urllib.parse import urlencode

    from starlette.requests import Request

    from agent.dashboard import Dashboard
    from contracts.settings import Settings
    from knowledge import MemoryKnowledge

    knowledge = MemoryKnowledge(Settings(history_length=20))
    board = Dashboard(Settings(), [], knowledge)

    def request(path_params: dict[str, str] | None = None, **query: str) -> Request:
        return Request({"type": "http", "method": "GET", "path_params": path_params or {},
                        "query_string": urlencode(query).encode(), "headers": []})

    async def answers() -> tuple[dict[str, Any], ...]:
        await knowledge.register_job("j1")
        for t in (10.0, 20.0):  # the default policy, its forecast not scored yet
            await knowledge.commit_window("j1", "analyze", t, json.dumps(analysis(t, forecast=runaway(t))))
            acted = decision(t, "scale_up" if t == 20 else "none", 4)
            await knowledge.commit_window("j1", "plan", t, json.dumps(acted))
        page = json.loads((await board.api_job(request({"job_id": "j1"}))).body)
        listed = json.loads((await board.api_jobs(request())).body)
        again = json.loads((await board.api_job(request({"job_id": "j1"}, since=page["version"]))).body)
        missing = await board.api_job(request({"job_id": "nosuch"}))
        return page, listed, again, {"status": missing.status_code}

    page, listed, again, missing = asyncio.run(answers())
    assert listed["jobs"] == [page["summary"]]
    assert page["summary"]["last_decision"]["action"] == "scale_up" and page["summary"]["parallelism"] == 2
    assert page["rates"]["x"][:2] == [10.0, 20.0] and page["version"] == "20.0/d20.0"
    assert page["forecast_note"].startswith("forecast (linear_trend) not trusted yet")
    assert page["rates"]["forecast_untrusted"][-1] == pytest.approx(560.0 + 7.2 * 12)
    assert page["rates_range"] == [0.0, pytest.approx(110.0)]  # 100 rec/s arrive; the forecast is clipped
    assert again == {"unchanged": True, "version": page["version"]}
    assert missing == {"status": 404}


def runaway(t: float) -> dict[str, Any]:
    """The forecast analyze fits across a step from 120 to 560 rec/s: a linear trend to 2,700 rec/s, upper band
    4,000, within five minutes."""
    return {"values": [560.0 + 7.2 * k for k in range(1, 31)], "upper": [700.0 + 11.0 * k for k in range(1, 31)],
            "start": t + 10.0, "step_s": 10.0, "method": "linear_trend"}


def memory(errors: list[float], level: float = 560.0) -> dict[str, Any]:
    """The default planner's memory in the plan state: its forecast's scored log errors, the arrival level."""
    skill = ForecastSkill(errors=errors)
    levels = LevelState(points=[(float(t), math.log(level)) for t in range(0, 60, 10)])
    return PlannerMemory(skill=skill, level=levels).model_dump(mode="json")


def test_an_untrusted_forecast_is_drawn_apart_and_the_axis_stays_on_what_was_measured() -> None:
    step = [analysis(float(t), arrival_rate=560.0 if t > 100 else 120.0, observed_processing_rate=500.0,
                     capacity={"current": 690.0}) for t in range(300, 0, -10)]
    step[0]["forecast"] = runaway(300.0)
    trust = forecast_trust("default", memory([]))  # the level shifted: no score since
    assert trust is not None and not trust.trusted and "0 of 3 times" in trust.why
    series = job_series(step, [], 60.0, trust)
    rates = series["rates"]
    drawn = [v for v in rates["forecast_untrusted"] if v is not None]
    assert drawn == runaway(300.0)["values"][:len(drawn)] and len(drawn) == 14  # 145 s: half the history ahead
    assert set(rates["forecast"]) == set(rates["forecast_upper"]) == {None}  # the planner does not plan with it
    assert "not trusted yet" in series["forecast_note"] and "linear_trend" in series["forecast_note"]
    assert series["rates_range"] == [0.0, pytest.approx(690.0 * 1.1)]  # capacity, the highest measured
    missed = forecast_trust("default", memory([0.4, -0.5, 0.3]))
    assert missed is not None and not missed.trusted and "missed by 49%" in missed.why


def test_a_trusted_forecast_is_drawn_with_the_band_the_planner_caps_it_at() -> None:
    errors = [0.02, -0.04, 0.05, 0.01]
    trust = forecast_trust("default", memory(errors))
    assert trust is not None and trust.trusted and trust.band == ForecastSkill(errors=errors).band() > 0.04
    steady = [analysis(float(t), arrival_rate=560.0) for t in range(300, 0, -10)]
    steady[0]["forecast"] = runaway(300.0)
    series = job_series(steady, [], 60.0, trust)
    rates = series["rates"]
    shown = [(v, u) for v, u in zip(rates["forecast"], rates["forecast_upper"], strict=True) if v is not None]
    assert shown and all(u == pytest.approx(v * math.exp(trust.band)) for v, u in shown)
    assert set(rates["forecast_untrusted"]) == {None}
    assert series["forecast_note"].startswith("forecast (linear_trend) trusted: its 10-minute changes came true")
    assert series["rates_range"] == [0.0, pytest.approx(560.0 * 1.1)]  # a trusted forecast is clipped too
    # One that starts far from the measured level is not used by the planner, trusted or not.
    far = job_series(steady, [], 60.0, forecast_trust("default", memory([0.02, -0.04, 0.05], level=300.0)))
    assert set(far["rates"]["forecast"]) == {None} and "not used: it starts 89% from" in far["forecast_note"]
    assert any(v is not None for v in far["rates"]["forecast_untrusted"])


def test_only_the_default_policy_scores_its_forecast() -> None:
    assert forecast_trust("hybrid", memory([])) is None
    assert forecast_trust("default", {"something": "else"}) == ForecastTrust(
        False, 0.0, None, "not trusted: the planner's memory is not readable")
    with_band = job_series([analysis(10.0, forecast=runaway(10.0))], [], 60.0, None)
    assert with_band["forecast_note"] is None and with_band["rates"]["forecast_upper"][-1] == 700.0 + 11.0 * 12

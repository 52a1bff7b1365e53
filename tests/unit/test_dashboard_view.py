"""The dashboard's pure view: job rows, health, aligned chart series, decision marks, paging."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.dashboard_view import decision_detail, health, job_series, job_summary, page_of

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


def test_the_forecast_is_drawn_half_the_history_ahead_at_least_five_minutes() -> None:
    forecast = {"values": [1.0] * 400, "start": 0.0, "step_s": 10.0, "method": "linear_trend"}
    short = job_series([analysis(0.0, forecast=forecast)], [], 60.0)["rates"]
    assert max(t for t, v in zip(short["x"], short["forecast"], strict=True) if v is not None) == 300.0
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
        for t in (10.0, 20.0):
            await knowledge.commit_window("j1", "analyze", t, json.dumps(analysis(t)))
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
    assert page["rates"]["x"] == [10.0, 20.0] and page["version"] == "20.0/d20.0"
    assert again == {"unchanged": True, "version": page["version"]}
    assert missing == {"status": 404}

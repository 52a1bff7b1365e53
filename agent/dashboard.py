"""`autoscaler dashboard`: a live web view of every job, from knowledge (Redis), in a process of its own.

Why its own process rather than the agents' web port: the four stages may run as four workers, each
with a port of its own, while the dashboard shows every job and every agent; its JSON and charting
work would otherwise run on an agent's event loop, between the reports it must keep up with; and an
agent that is down is shown as unreachable rather than taking the dashboard with it.

The decisions it charts are read from knowledge, not from the decisions topic: plan commits each
decision to the job's history in Redis before publishing it (the history is its outbox), so Redis
holds every decision the topic carries, and a page opened late sees the history too. Pages poll
(every 2 s on a job, 5 s on the list); a poll with nothing new costs two Redis reads.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from agent.dashboard_view import forecast_trust, job_series, job_summary, page_of
from contracts.jobs import JobConfig
from contracts.settings import Settings
from infra.security import redact
from infra.web import uplot_css, uplot_js
from infra.webauth import (
    COOKIE,
    UNAUTHORIZED,
    bearer_headers,
    bearer_matches,
    cookie_matches,
    session_cookie,
    web_token,
)
from knowledge import Knowledge, RedisKnowledge

PAGE_SIZE = 50
AGENT_TIMEOUT_S = 1.0
# Job rows read at once. Each takes five Redis connections of the client's pool (100 by default), so
# 16 rows stay within it (page times: docs/results.md, "Measurements moved from docstrings").
CONCURRENT_ROWS = 16


@cache
def _own(name: str) -> str:
    """The dashboard's own script and style sheet (agent/web)."""
    return resources.files("agent").joinpath("web", name).read_text(encoding="utf-8")


def _page(title: str, body: str, charts: bool = False, **data: str) -> str:
    """A page; only a job's page, which draws charts, loads uPlot (the job list is drawn sooner without it)."""
    attributes = " ".join(f'data-{name}="{html.escape(value)}"' for name, value in data.items())
    uplot_css = '<link rel="stylesheet" href="/static/uplot.css">' if charts else ""
    uplot_js = '<script src="/static/uplot.js"></script>' if charts else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
{uplot_css}<link rel="stylesheet" href="/static/dashboard.css">
</head><body {attributes}>
<header><a href="/">autoscaler</a> <span id="agents"></span></header>
<main>{body}</main>
{uplot_js}<script src="/static/dashboard.js"></script>
</body></html>"""


LIST_BODY = """<h1>Jobs</h1>
<div id="error" class="error" hidden></div>
<form id="search"><input id="q" name="q" placeholder="search jobs" autocomplete="off">
<button id="prev" type="button">&larr;</button> <span id="paging"></span>
<button id="next" type="button">&rarr;</button>
</form>
<table id="jobs"><thead><tr><th>job</th><th>mode</th><th>policy</th><th>parallelism</th><th>health</th>
<th>last decision</th></tr></thead><tbody></tbody></table>"""

JOB_BODY = """<h1 id="title"></h1>
<div id="error" class="error" hidden></div>
<p id="summary"></p>
<div id="empty" hidden>No window analysed yet: the charts appear with the first analysis.</div>
<section id="charts"></section>
<div id="detail" class="detail">Point at or click a decision mark for its reason and numbers.</div>
<h2>Latest decisions</h2>
<table id="decisions"><thead><tr><th>window end</th><th>action</th><th>from</th><th>to</th><th>rule</th>
<th>reason</th><th>why</th><th>numbers</th></tr></thead><tbody></tbody></table>"""


class Dashboard:
    """The routes' shared state: knowledge, the settings and the agents to check."""

    def __init__(self, settings: Settings, agents: list[str], knowledge: Knowledge | None = None) -> None:
        self.settings = settings
        self.agents = agents
        self.knowledge = knowledge or RedisKnowledge(settings)
        self._agent_status: tuple[float, list[dict[str, str]]] = (0.0, [])
        self._rows = asyncio.Semaphore(CONCURRENT_ROWS)

    # ---------------------------------------------------------------- pages

    async def index(self, request: Request) -> Response:
        return HTMLResponse(_page("autoscaler: jobs", LIST_BODY, page="list"))

    async def job_page(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        if not await self.knowledge.job_exists(job_id):
            return HTMLResponse(await self._not_found(job_id), status_code=404)
        return HTMLResponse(_page(f"autoscaler: {job_id}", JOB_BODY, charts=True, page="job", job=job_id))

    async def _not_found(self, job_id: str) -> str:
        jobs, total = page_of(await self.knowledge.jobs(), "", 1, PAGE_SIZE)
        items = "".join(f'<li><a href="/jobs/{html.escape(j)}">{html.escape(j)}</a></li>' for j in jobs)
        more = f'<p>{total - len(jobs)} more: <a href="/">search the job list</a>.</p>' if total > len(jobs) else ""
        body = (f'<h1>No job {html.escape(job_id)!s}</h1><p class="error">No job with this id is registered. '
                f"Registered jobs ({total}):</p><ul id=\"known\">{items}</ul>{more}")
        return _page("autoscaler: unknown job", body, page="missing")

    # ---------------------------------------------------------------- JSON

    async def api_jobs(self, request: Request) -> Response:
        try:
            page, size = int(request.query_params.get("page", 1)), int(request.query_params.get("size", PAGE_SIZE))
        except ValueError:
            return JSONResponse({"error": "page and size must be integers"}, status_code=400)
        size = min(max(size, 1), 200)
        jobs, total = page_of(await self.knowledge.jobs(), request.query_params.get("q", ""), page, size)
        rows = await asyncio.gather(*(self._summary(job) for job in jobs))
        return JSONResponse({"total": total, "page": page, "size": size, "jobs": rows})

    async def _summary(self, job_id: str,
                       read: tuple[JobConfig, dict[str, Any] | None, list[dict[str, Any]]] | None = None,
                       ) -> dict[str, Any]:
        """A job's row; `read`: its configuration, last analysis and last decision, if already read."""
        async with self._rows:
            if read is None:
                config, state, analysis, decisions, events = await asyncio.gather(
                    self.knowledge.job_config(job_id), self.knowledge.plan_state(job_id),
                    self.knowledge.last_analysis(job_id), self.knowledge.decisions(job_id, 1),
                    self.knowledge.events(job_id, 1))
            else:
                config, analysis, decisions = read
                state, events = await asyncio.gather(self.knowledge.plan_state(job_id),
                                                     self.knowledge.events(job_id, 1))
        return job_summary(job_id, config.model_dump(mode="json"), state.parallelism, analysis,
                           decisions[0] if decisions else None, events[0] if events else None,
                           self.settings.loop_interval_s, time.time())

    async def api_job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        if not await self.knowledge.job_exists(job_id):
            return JSONResponse({"error": f"no job {job_id!r} is registered"}, status_code=404)
        since = request.query_params.get("since", "")
        latest = await self.knowledge.decisions(job_id, 1)
        analysis = await self.knowledge.last_analysis(job_id)
        version = f"{(analysis or {}).get('window_end')}/{latest[0]['decision_id'] if latest else None}"
        if since and since == version:
            return JSONResponse({"unchanged": True, "version": version})
        config: JobConfig = await self.knowledge.job_config(job_id)
        analyses, decisions, summary, state = await asyncio.gather(
            self.knowledge.analyses(job_id, self.settings.history_length),
            self.knowledge.decisions(job_id, self.settings.history_length),
            self._summary(job_id, (config, analysis, latest)), self.knowledge.plan_state(job_id))
        # The forecast is drawn as the job's planner uses it: trusted or not (the default policy's memory).
        series = job_series(analyses, decisions, config.backlog_target_s,
                            forecast_trust(config.policy, state.policy_state))
        return JSONResponse({"version": version, "summary": summary, "backlog_target_s": config.backlog_target_s,
                             **series})

    async def api_agents(self, request: Request) -> Response:
        checked_at, status = self._agent_status
        if time.monotonic() - checked_at > 2.0:
            status = list(await asyncio.gather(*(asyncio.to_thread(self._check_agent, url) for url in self.agents)))
            self._agent_status = (time.monotonic(), status)
        return JSONResponse({"agents": status})

    def _check_agent(self, url: str) -> dict[str, str]:
        # The agents' pages take the same token as the dashboard (AUTOSCALER_WEB_TOKEN).
        request = urllib.request.Request(f"{url.rstrip('/')}/ready", headers=bearer_headers(self.settings))
        try:
            with urllib.request.urlopen(request, timeout=AGENT_TIMEOUT_S) as response:
                ready = json.loads(response.read())
            return {"url": url, "status": "ok", "detail": ", ".join(ready.get("stages", []))}
        except urllib.error.HTTPError as exc:  # 503: its knowledge does not answer or it is starting; 401
            body = exc.read().decode(errors="replace")
            return {"url": url, "status": "degraded", "detail": redact(f"HTTP {exc.code}: {body}", self.settings)}
        except (OSError, ValueError) as exc:
            return {"url": url, "status": "unreachable", "detail": redact(str(exc), self.settings)}

    # ---------------------------------------------------------------- static files

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        files = {"uplot.js": (uplot_js, "text/javascript"), "uplot.css": (uplot_css, "text/css"),
                 "dashboard.js": (lambda: _own("dashboard.js"), "text/javascript"),
                 "dashboard.css": (lambda: _own("dashboard.css"), "text/css")}
        if name not in files:
            return Response("not found", status_code=404)
        read, media_type = files[name]
        return Response(read(), media_type=media_type, headers={"Cache-Control": "max-age=3600"})


def create_dashboard(settings: Settings, agents: list[str], knowledge: Knowledge | None = None) -> Starlette:
    """The ASGI app; `agents` are the agents' base URLs whose /ready the header shows."""
    board = Dashboard(settings, agents, knowledge)

    async def knowledge_down(request: Request, exc: Exception) -> Response:
        message = f"knowledge (Redis) unreachable: {redact(str(exc), settings)}"
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=503)
        return HTMLResponse(_page("autoscaler: knowledge unreachable", f'<p class="error">{html.escape(message)}</p>'),
                            status_code=503)

    routes = [
        Route("/", board.index), Route("/jobs/{job_id}", board.job_page),
        Route("/api/jobs", board.api_jobs), Route("/api/jobs/{job_id}", board.api_job),
        Route("/api/agents", board.api_agents), Route("/static/{name}", board.static),
    ]
    from redis.exceptions import RedisError

    token = web_token(settings)
    middleware = [Middleware(BaseHTTPMiddleware, dispatch=_token_required(token))] if token else []
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={RedisError: knowledge_down, OSError: knowledge_down})


def _token_required(token: str) -> Callable[[Request, RequestResponseEndpoint], Awaitable[Response]]:
    """Every page wants the token: `Authorization: Bearer`, or the session cookie a browser gets by
    opening any page once with `?token=`; it is then sent to the same page without the token."""

    async def dispatch(request: Request, call_next: RequestResponseEndpoint) -> Response:
        given = request.query_params.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            response: Response = RedirectResponse(request.url.path + (f"?{query}" if query else ""), status_code=303)
            response.set_cookie(COOKIE, session_cookie(token), httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
            return response
        if bearer_matches(request.headers.get("Authorization"), token) or \
                cookie_matches(request.cookies.get(COOKIE), token):
            return await call_next(request)
        headers = {"WWW-Authenticate": "Bearer"}
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": UNAUTHORIZED}, status_code=401, headers=headers)
        body = (f'<p class="error">{html.escape(UNAUTHORIZED)}; in a browser, open this page once with '
                "<code>?token=TOKEN</code>.</p>")
        return HTMLResponse(_page("autoscaler: token required", body), status_code=401, headers=headers)

    return dispatch


def serve(settings: Settings, host: str, port: int, agents: list[str]) -> None:
    import uvicorn

    uvicorn.run(create_dashboard(settings, agents), host=host, port=port, log_level="warning")

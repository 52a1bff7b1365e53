"""The web pages' exposure: the agents' listen address, the bearer token's settings, and the
dashboard's token check (served by uvicorn on a free port, knowledge in memory)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.dashboard import create_dashboard
from contracts.settings import Settings, settings_env
from infra.security import redact
from infra.webauth import COOKIE, bearer_headers, bearer_matches, session_cookie
from knowledge.memory import MemoryKnowledge
from stack.processes import free_port, wait_for_port

TOKEN = "t0ken-of-the-web-pages"  # distinctive, so a leak is easy to spot


# ---------------------------------------------------------------- settings


def test_the_agents_listen_on_loopback_by_default() -> None:
    assert Settings().web_host == "127.0.0.1"
    assert Settings().web_bearer_token is None
    assert settings_env(Settings(web_host="0.0.0.0"))["AUTOSCALER_WEB_HOST"] == "0.0.0.0"


def test_the_token_comes_from_the_setting_or_a_file_never_both(tmp_path: Path) -> None:
    assert Settings(web_token=TOKEN).web_bearer_token.get_secret_value() == TOKEN  # type: ignore[union-attr]
    file = tmp_path / "token"
    file.write_text(f"{TOKEN}\n")
    from_file = Settings(web_token_file=str(file))
    assert from_file.web_bearer_token.get_secret_value() == TOKEN  # type: ignore[union-attr]
    assert from_file.model_copy(update={"web_port": 1}).web_bearer_token == from_file.web_bearer_token
    assert Settings(web_token="").web_bearer_token is None  # an empty variable means no token
    with pytest.raises(ValidationError, match="not both"):
        Settings(web_token=TOKEN, web_token_file=str(file))
    with pytest.raises(ValidationError, match="AUTOSCALER_WEB_TOKEN_FILE"):
        Settings(web_token_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValidationError, match="empty"):
        Settings(web_token_file=str(tmp_path / "empty"))


def test_the_token_is_never_shown(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(TOKEN)
    for settings in (Settings(web_token=TOKEN), Settings(web_token_file=str(file))):
        assert TOKEN not in repr(settings) and TOKEN not in str(settings)
        assert TOKEN not in redact(f"GET /ready Authorization: Bearer {TOKEN}", settings)
    # A child process gets it by environment, as the other secrets.
    assert settings_env(Settings(web_token=TOKEN))["AUTOSCALER_WEB_TOKEN"] == TOKEN
    assert settings_env(Settings(web_token_file=str(file)))["AUTOSCALER_WEB_TOKEN_FILE"] == str(file)
    assert "AUTOSCALER_WEB_TOKEN" not in settings_env(Settings())


def test_bearer_header() -> None:
    assert bearer_headers(Settings()) == {}
    header = bearer_headers(Settings(web_token=TOKEN))["Authorization"]
    assert bearer_matches(header, TOKEN) and bearer_matches(f"bearer  {TOKEN} ", TOKEN)
    for wrong in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "):
        assert not bearer_matches(wrong, TOKEN)


# ---------------------------------------------------------------- the dashboard


def serve(settings: Settings) -> Iterator[str]:
    import uvicorn

    port = free_port()
    app = create_dashboard(settings, [], MemoryKnowledge(settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for_port("127.0.0.1", port, timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def guarded() -> Iterator[str]:
    yield from serve(Settings(web_token=TOKEN))


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Message, str]:
    """Status, headers (names in any case) and body, redirects not followed."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=5) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def test_the_dashboard_answers_401_without_its_token_and_is_open_without_one(guarded: str) -> None:
    for url in serve(Settings()):
        assert get(url + "/api/jobs")[0] == 200
    for path in ("/", "/api/jobs", "/api/agents", "/jobs/x", "/static/dashboard.js"):
        status, headers, body = get(guarded + path)
        assert status == 401, path
        assert headers["WWW-Authenticate"] == "Bearer" and TOKEN not in body
        assert get(guarded + path, {"Authorization": "Bearer wrong"})[0] == 401
    status, _, body = get(guarded + "/api/jobs")
    assert "bearer token" in json.loads(body)["error"]
    status, _, body = get(guarded + "/api/jobs", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body)["total"] == 0
    assert get(guarded + "/", {"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_a_browser_opens_the_dashboard_once_with_the_token_then_carries_a_cookie(guarded: str) -> None:
    assert get(f"{guarded}/?token=wrong")[0] == 401
    status, headers, _ = get(f"{guarded}/?q=a+b&token={TOKEN}")
    assert status == 303 and headers["location"] == "/?q=a+b"  # the token leaves the address bar
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={session_cookie(TOKEN)};") and TOKEN not in cookie
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert get(f"{guarded}/api/jobs", {"Cookie": f"{COOKIE}={session_cookie(TOKEN)}"})[0] == 200
    assert get(f"{guarded}/api/jobs", {"Cookie": f"{COOKIE}={session_cookie('other')}"})[0] == 401
    # The cookie is not the token: it opens nothing on the agents' pages.
    assert not bearer_matches(f"Bearer {session_cookie(TOKEN)}", TOKEN)


# ---------------------------------------------------------------- the agents' web server and readiness


def test_the_agents_listen_where_the_setting_says() -> None:
    from agent.app import create_app

    for settings, bind in ((Settings(), "127.0.0.1"), (Settings(web_host="0.0.0.0"), "0.0.0.0")):
        app, _ = create_app(settings, ["plan"])
        assert app.conf.web_bind == bind


def test_readiness_needs_an_assignment_and_a_fetch_begun_after_it() -> None:
    from agent.app import Readiness

    ready = Readiness()
    assert ready.waiting_for() == "partition assignment"
    ready.fetched(began=1.0)  # before any assignment: it counts for nothing
    ready.assigned(3, at=5.0)
    assert ready.waiting_for() == "the first fetch"
    ready.fetched(began=4.0)  # began before the assignment (an older fetch)
    assert ready.waiting_for() == "the first fetch"
    ready.fetched(began=5.5)
    assert ready.waiting_for() is None
    ready.assigned(0, at=9.0)  # a later rebalance takes every partition away: still ready
    assert ready.waiting_for() is None and ready.partitions == 0


def test_a_worker_assigned_no_partition_is_ready_without_a_fetch() -> None:
    from agent.app import Readiness

    ready = Readiness()
    ready.assigned(0, at=1.0)
    assert ready.waiting_for() is None

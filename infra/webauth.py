"""Bearer tokens for the agents' web pages and the dashboard (`AUTOSCALER_WEB_TOKEN` / `_FILE`).

Without a token the pages need no authentication (they listen on 127.0.0.1 by default). With one,
every request must carry `Authorization: Bearer <token>`; a browser on the dashboard may instead
open `/?token=<token>` once and carry a cookie derived from the token (never the token itself)."""

from __future__ import annotations

import hashlib
import hmac

from contracts.settings import Settings

COOKIE = "autoscaler_session"
UNAUTHORIZED = "a bearer token is required (Authorization: Bearer <AUTOSCALER_WEB_TOKEN>)"


def web_token(settings: Settings) -> str | None:
    secret = settings.web_bearer_token
    return secret.get_secret_value() if secret is not None else None


def bearer_headers(settings: Settings) -> dict[str, str]:
    """The headers a client of the agents' pages or the dashboard sends: the token, if one is set."""
    token = web_token(settings)
    return {"Authorization": f"Bearer {token}"} if token else {}


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `token` (compared in constant time)."""
    scheme, _, given = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def session_cookie(token: str) -> str:
    """The dashboard's cookie value for `token`: a key derived from it, useless on the agents' pages."""
    return hmac.new(token.encode(), b"autoscaler dashboard session", hashlib.sha256).hexdigest()


def cookie_matches(cookie: str | None, token: str) -> bool:
    return cookie is not None and hmac.compare_digest(cookie.encode(), session_cookie(token).encode())

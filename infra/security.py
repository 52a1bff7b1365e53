"""Client security from settings: one builder per client family, and redaction of secrets.

Every Kafka and Redis client the autoscaler builds takes its authentication and TLS from here, so
a setting means the same thing in every process. The builders only read settings (the Faust one
also reads the certificate files into an SSL context).
"""

from __future__ import annotations

import re
import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from contracts.settings import Settings

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT


class EntryPointNotAllowed(ValueError):
    """A job entry point that the configuration does not list."""


# ---------------------------------------------------------------- Kafka


def kafka_security_config(settings: Settings) -> dict[str, str]:
    """librdkafka (confluent-kafka) security properties; empty for PLAINTEXT, today's default."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {}
    config = {"security.protocol": protocol}
    if protocol.startswith("SASL_"):
        assert settings.kafka_sasl_username is not None and settings.kafka_sasl_password is not None  # validated
        config["sasl.mechanism"] = settings.kafka_sasl_mechanism
        config["sasl.username"] = settings.kafka_sasl_username
        config["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    if protocol in ("SSL", "SASL_SSL"):
        optional = {
            "ssl.ca.location": settings.kafka_ssl_ca_file,
            "ssl.certificate.location": settings.kafka_ssl_cert_file,
            "ssl.key.location": settings.kafka_ssl_key_file,
            "ssl.key.password": (
                settings.kafka_ssl_key_password.get_secret_value() if settings.kafka_ssl_key_password else None
            ),
        }
        config.update({key: value for key, value in optional.items() if value is not None})
    return config


def kafka_ssl_context(settings: Settings) -> ssl.SSLContext:
    """The TLS context of the Faust (aiokafka) clients: server verification, optional client cert."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.kafka_ssl_ca_file)
    if settings.kafka_ssl_cert_file and settings.kafka_ssl_key_file:
        password = settings.kafka_ssl_key_password.get_secret_value() if settings.kafka_ssl_key_password else None
        context.load_cert_chain(settings.kafka_ssl_cert_file, settings.kafka_ssl_key_file, password=password)
    return context


def faust_credentials(settings: Settings) -> CredentialsT | None:
    """`broker_credentials` for faust.App; None for PLAINTEXT."""
    import faust  # here: the job runner uses this module without Faust's import cost

    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = kafka_ssl_context(settings) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    assert settings.kafka_sasl_password is not None  # validated
    # With an SSL context SASLCredentials speaks SASL_SSL, without one SASL_PLAINTEXT.
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=settings.kafka_sasl_password.get_secret_value(),
        mechanism=settings.kafka_sasl_mechanism,
        ssl_context=context,
    )


# ---------------------------------------------------------------- Redis


def redis_client_kwargs(settings: Settings, *, asyncio: bool = True) -> dict[str, Any]:
    """Keyword arguments for `from_url(settings.redis_url, ...)` (redis.asyncio, or redis when
    `asyncio` is false): AUTH and TLS from settings. Empty by default, as before."""
    kwargs: dict[str, Any] = {}
    if settings.redis_password is not None:
        kwargs["password"] = settings.redis_password.get_secret_value()
    if settings.redis_username:
        kwargs["username"] = settings.redis_username
    if settings.redis_uses_tls:
        if asyncio:
            from redis.asyncio.connection import SSLConnection
        else:
            from redis.connection import SSLConnection  # type: ignore[assignment]
        # from_url picks the TLS connection only for rediss://; this makes AUTOSCALER_REDIS_TLS work
        # with a redis:// URL too.
        kwargs["connection_class"] = SSLConnection
        kwargs["ssl_cert_reqs"] = "required"
        optional = {
            "ssl_ca_certs": settings.redis_tls_ca_file,
            "ssl_certfile": settings.redis_tls_cert_file,
            "ssl_keyfile": settings.redis_tls_key_file,
        }
        kwargs.update({key: value for key, value in optional.items() if value is not None})
    return kwargs


# ---------------------------------------------------------------- redaction

# scheme://userinfo@ : the userinfo (user:password) of any URL in the text. Greedy up to the last
# "@" before a "/" or a space, so an unescaped "@" inside a password is covered too.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/]*@")
_MARKER_CHARS = "*#~" + "".join(chr(c) for c in range(0x2591, 0x25A0))


def secret_values(settings: Settings) -> list[str]:
    """Every secret the settings hold, as it could appear in text (URL passwords raw and decoded)."""
    values = [
        secret.get_secret_value()
        for secret in (settings.kafka_sasl_password, settings.kafka_ssl_key_password, settings.redis_password,
                       settings.web_bearer_token)
        if secret is not None
    ]
    url_password = urlsplit(settings.redis_url).password
    if url_password:
        values += [url_password, unquote(url_password), quote(unquote(url_password), safe="")]
    return sorted({v for v in values if v}, key=len, reverse=True)


def _marker(secrets: list[str]) -> str:
    # A marker sharing no character with any secret: replacing with it can never spell a secret anew.
    used = set("".join(secrets))
    for char in _MARKER_CHARS:
        if char not in used:
            return char * 3
    code = 0x2600
    while chr(code) in used:
        code += 1
    return chr(code) * 3


def redact(text: str, settings: Settings | None = None) -> str:
    """`text` without URL credentials (`scheme://user:password@`) and without any secret value
    configured in `settings`, for anything logged or returned."""
    secrets = secret_values(settings) if settings is not None else []
    marker = _marker(secrets)
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{marker}@", text)
    if not secrets:
        return text
    # Mark every (possibly overlapping) occurrence first, then cut all marked spans at once:
    # replacing one secret at a time could join pieces into another occurrence.
    covered = [False] * len(text)
    for secret in secrets:
        start = text.find(secret)
        while start != -1:
            for i in range(start, start + len(secret)):
                covered[i] = True
            start = text.find(secret, start + 1)
    if not any(covered):
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if covered[i]:
            while i < len(text) and covered[i]:
                i += 1
            out.append(marker)
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# ---------------------------------------------------------------- job entry points


def check_entry_point(spec: str, settings: Settings) -> str:
    """`spec` if the configuration allows it; the runner imports nothing else."""
    if spec not in settings.job_entry_points:
        allowed = ", ".join(settings.job_entry_points) or "none"
        raise EntryPointNotAllowed(
            f"entry point {spec!r} is not in AUTOSCALER_JOB_ENTRY_POINTS (allowed: {allowed}); "
            "add it there to run it"
        )
    return spec

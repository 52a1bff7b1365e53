"""Redaction: no configured secret and no URL credential survives `infra.security.redact`, and the
places that log or publish error text (Redis retries, runner reports) redact it first."""

from __future__ import annotations

import logging
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from contracts.decisions import RunnerReport, RunnerStatus
from contracts.settings import Settings
from infra.security import redact

PASSWORD = "pa55-w0rd!"  # distinctive, so a leak is easy to spot


# ---------------------------------------------------------------- redaction


def test_redact_removes_url_credentials_and_configured_secrets() -> None:
    settings = Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="SCRAM-SHA-512",
                        kafka_sasl_username="autoscaler", kafka_sasl_password=PASSWORD, redis_password="r3dis")
    text = f"connect redis://user:{PASSWORD}@h:6379/0 failed; auth r3dis; sasl {PASSWORD}; kafka://h:9092 ok"
    out = redact(text, settings)
    assert PASSWORD not in out and "r3dis" not in out and "user:" not in out
    assert "redis://***@h:6379/0" in out and "kafka://h:9092 ok" in out
    assert redact("nothing secret at redis://h:6379/0", settings) == "nothing secret at redis://h:6379/0"
    # Without settings, URL credentials still go.
    assert redact("amqp://a:b@c/d") == "amqp://***@c/d"


def test_redact_a_password_given_in_the_redis_url() -> None:
    password = "p@ss/w:rd"
    settings = Settings(redis_url=f"redis://:{quote(password, safe='')}@h:6379/0")
    out = redact(f"the password was {password} (quoted {quote(password, safe='')})", settings)
    assert password not in out and quote(password, safe="") not in out


passwords = st.text(min_size=1, max_size=40).filter(lambda p: p == p.strip() and "\x00" not in p)


@hypothesis_settings(max_examples=300, deadline=None)
@given(password=passwords, before=st.text(max_size=30), after=st.text(max_size=30))
def test_redact_property_a_configured_password_never_survives(password: str, before: str, after: str) -> None:
    for settings in (
        Settings(redis_password=password),
        Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="u", kafka_sasl_password=password),
        Settings(redis_url=f"redis://:{quote(password, safe='')}@h:6379/0"),
    ):
        text = f"{before}{password}{after} and again {password}{password}"
        assert password not in redact(text, settings)


# Any userinfo a URL can carry unescaped: no separator ("/", "@") and no white space.
userinfo_text = st.text(st.characters(blacklist_categories=("Z", "Cc", "Cs"), blacklist_characters="/@"), min_size=1)


@hypothesis_settings(max_examples=200, deadline=None)
@given(user=userinfo_text, password=userinfo_text)
def test_redact_property_url_credentials_without_settings(user: str, password: str) -> None:
    # Not configured anywhere: the URL pattern alone removes the whole user:password part.
    out = redact(f"error at redis://{user}:{password}@host:6379/0", None)
    assert out == "error at redis://***@host:6379/0"


def test_redact_never_spells_a_secret_with_its_marker() -> None:
    settings = Settings(redis_password="*")
    assert "*" not in redact("a*b***c", settings)


# ---------------------------------------------------------------- where redaction is used


def test_until_done_logs_redis_errors_redacted(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from infra.resilience import until_done

    settings = Settings(redis_password=PASSWORD)
    calls = 0

    async def work() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError(f"redis://default:{PASSWORD}@127.0.0.1:1/0 refused ({PASSWORD})")
        return 7

    with caplog.at_level(logging.WARNING, logger="autoscaler"):
        assert asyncio.run(until_done(work, "test", first_delay=0.01, settings=settings)) == 7
    assert "degraded" in caplog.text and PASSWORD not in caplog.text


def test_runner_reports_are_redacted_before_publishing() -> None:
    from execute.commands import ReportPublisher

    settings = Settings(redis_password=PASSWORD)
    publisher = ReportPublisher("127.0.0.1:1", "reports", settings=settings)
    sent: list[bytes] = []

    class FakeProducer:
        def produce(self, topic: str, key: bytes, value: bytes) -> None:
            sent.append(value)

        def flush(self, timeout: float) -> int:
            return 0

    publisher.producer = FakeProducer()  # type: ignore[assignment]
    publisher.publish(RunnerReport(
        decision_id="d", job_id="j", status=RunnerStatus.FAILED, from_parallelism=1, to_parallelism=2,
        running_parallelism=1, fencing_token=1, error=f"failed with {PASSWORD}",
    ))
    assert sent and PASSWORD.encode() not in sent[0]

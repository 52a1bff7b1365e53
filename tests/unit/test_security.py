"""Security settings: client configs per family, validation, the entry-point allowlist. Redaction of
secrets: test_redaction.py."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from contracts.decisions import RescaleCommand
from contracts.settings import DEFAULT_JOB_ENTRY_POINTS, Settings, settings_env
from infra.kafka import group_consumer_config, kafka_client_config
from infra.security import (
    EntryPointNotAllowed,
    check_entry_point,
    faust_credentials,
    kafka_security_config,
    redis_client_kwargs,
)

PASSWORD = "pa55-w0rd!"  # distinctive, so a leak is easy to spot


def sasl(**extra: Any) -> Settings:
    return Settings(
        kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="autoscaler", kafka_sasl_password=PASSWORD, **extra,
    )


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A self-signed certificate and its key (PEM), as a CA bundle and a client identity."""
    # No skip: a TLS test that skips tests nothing (./dev setup installs openssl).
    assert shutil.which("openssl"), "the TLS tests need openssl: ./dev setup installs it"
    folder = tmp_path_factory.mktemp("pem")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )
    return {"cert": str(cert), "key": str(key)}


# ---------------------------------------------------------------- defaults: today's behaviour


def test_defaults_are_plaintext_without_auth() -> None:
    settings = Settings()
    assert kafka_security_config(settings) == {}
    assert kafka_client_config(settings) == {"bootstrap.servers": settings.kafka_bootstrap}
    assert faust_credentials(settings) is None
    assert redis_client_kwargs(settings) == {}
    assert redis_client_kwargs(settings, asyncio=False) == {}
    env = settings_env(settings)
    assert not [name for name in env if "SASL" in name or "SSL" in name or "SECURITY" in name]
    assert not [name for name in env if "REDIS_" in name and name != "AUTOSCALER_REDIS_URL"]
    assert "AUTOSCALER_JOB_ENTRY_POINTS" not in env
    assert settings.job_entry_points == list(DEFAULT_JOB_ENTRY_POINTS)


# ---------------------------------------------------------------- Kafka (confluent-kafka)


def test_sasl_plaintext_config_is_accepted_by_librdkafka() -> None:
    from confluent_kafka import Producer

    settings = sasl()
    config = kafka_client_config(settings)
    assert config == {
        "bootstrap.servers": settings.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "autoscaler",
        "sasl.password": PASSWORD,
    }
    # librdkafka checks property names and values when the client is created (no connection yet).
    Producer(config)


def test_sasl_ssl_config_with_mutual_tls(pem: dict[str, str]) -> None:
    from confluent_kafka import Consumer

    settings = Settings(
        kafka_security_protocol="SASL_SSL", kafka_sasl_username="u", kafka_sasl_password=PASSWORD,
        kafka_ssl_ca_file=pem["cert"], kafka_ssl_cert_file=pem["cert"], kafka_ssl_key_file=pem["key"],
    )
    config = kafka_security_config(settings)
    assert config == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": PASSWORD,
        "ssl.ca.location": pem["cert"],
        "ssl.certificate.location": pem["cert"],
        "ssl.key.location": pem["key"],
    }
    Consumer(group_consumer_config(settings, "g", "earliest")).close()


def test_ssl_only_has_no_sasl_and_a_key_password() -> None:
    settings = Settings(kafka_security_protocol="SSL", kafka_ssl_ca_file="ca.pem", kafka_ssl_cert_file="c.pem",
                        kafka_ssl_key_file="k.pem", kafka_ssl_key_password="keypass")
    config = kafka_security_config(settings)
    assert config["security.protocol"] == "SSL"
    assert config["ssl.key.password"] == "keypass"
    assert not [key for key in config if key.startswith("sasl.")]


def test_group_consumer_config_carries_security_from_settings_or_explicitly() -> None:
    settings = sasl()
    from_settings = group_consumer_config(settings, "g", "latest", **{"fetch.wait.max.ms": 5})
    explicit = group_consumer_config(
        settings.kafka_bootstrap, "g", "latest", security=kafka_security_config(settings), **{"fetch.wait.max.ms": 5}
    )
    assert from_settings == explicit
    assert from_settings["sasl.password"] == PASSWORD and from_settings["group.id"] == "g"
    assert "security.protocol" not in group_consumer_config("h:1", "g", "latest")


# ---------------------------------------------------------------- Kafka (Faust / aiokafka)


def test_faust_credentials_per_protocol(pem: dict[str, str]) -> None:
    import faust
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    plain = faust_credentials(sasl())
    assert isinstance(plain, faust.SASLCredentials)
    auth = credentials_to_aiokafka_auth(plain)
    assert auth["security_protocol"] == "SASL_PLAINTEXT" and auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert auth["sasl_plain_username"] == "autoscaler" and auth["sasl_plain_password"] == PASSWORD
    assert PASSWORD not in repr(plain)

    sasl_ssl = faust_credentials(Settings(
        kafka_security_protocol="SASL_SSL", kafka_sasl_username="u", kafka_sasl_password=PASSWORD,
        kafka_ssl_ca_file=pem["cert"],
    ))
    auth = credentials_to_aiokafka_auth(sasl_ssl)
    assert auth["security_protocol"] == "SASL_SSL" and isinstance(auth["ssl_context"], ssl.SSLContext)

    tls = faust_credentials(Settings(kafka_security_protocol="SSL", kafka_ssl_ca_file=pem["cert"],
                                     kafka_ssl_cert_file=pem["cert"], kafka_ssl_key_file=pem["key"]))
    assert isinstance(tls, faust.SSLCredentials)
    auth = credentials_to_aiokafka_auth(tls)
    assert auth["security_protocol"] == "SSL"
    assert auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_create_app_passes_the_credentials_to_faust() -> None:
    from agent.app import create_app

    app, _ = create_app(sasl(), ["monitor"])
    credentials = app.conf.broker_credentials
    assert credentials is not None and credentials.password == PASSWORD
    assert credentials.mechanism.value == "SCRAM-SHA-512"
    app_plain, _ = create_app(Settings(), ["monitor"])
    assert app_plain.conf.broker_credentials is None


# ---------------------------------------------------------------- Redis


def test_redis_kwargs_auth_and_tls() -> None:
    import redis
    import redis.asyncio as aioredis

    settings = Settings(redis_password=PASSWORD, redis_username="scaler", redis_tls=True,
                        redis_tls_ca_file="ca.pem", redis_tls_cert_file="c.pem", redis_tls_key_file="k.pem")
    kwargs = redis_client_kwargs(settings)
    assert kwargs["password"] == PASSWORD and kwargs["username"] == "scaler"
    assert kwargs["connection_class"] is aioredis.SSLConnection
    assert redis_client_kwargs(settings, asyncio=False)["connection_class"] is redis.SSLConnection
    # The clients are built (no connection yet) and keep the settings, though the URL is redis://.
    client = aioredis.from_url(settings.redis_url, **kwargs)
    pool_kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is aioredis.SSLConnection
    assert pool_kwargs["password"] == PASSWORD and pool_kwargs["ssl_ca_certs"] == "ca.pem"
    sync = redis.Redis.from_url(settings.redis_url, **redis_client_kwargs(settings, asyncio=False))
    assert sync.connection_pool.connection_class is redis.SSLConnection


def test_rediss_url_means_tls() -> None:
    settings = Settings(redis_url="rediss://cache.example:6380/0", redis_tls_ca_file="ca.pem")
    assert settings.redis_uses_tls
    assert redis_client_kwargs(settings)["ssl_ca_certs"] == "ca.pem"


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "needs AUTOSCALER_KAFKA_SASL_USERNAME"),
        ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u"}, "AUTOSCALER_KAFKA_SASL_PASSWORD"),
        ({"kafka_sasl_username": "u", "kafka_sasl_password": PASSWORD}, "use SASL_PLAINTEXT or SASL_SSL"),
        ({"kafka_ssl_ca_file": "ca.pem"}, "use SSL or SASL_SSL"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_cert_file": "c.pem"}, "go together"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_key_password": PASSWORD}, "needs AUTOSCALER_KAFKA_SSL_KEY_FILE"),
        ({"kafka_security_protocol": "SASL"}, "kafka_security_protocol"),
        ({"kafka_sasl_mechanism": "GSSAPI"}, "kafka_sasl_mechanism"),
        ({"redis_url": f"redis://:{PASSWORD}@h:6379/0", "redis_password": PASSWORD}, "not both"),
        ({"redis_username": "scaler"}, "needs a password"),
        ({"redis_tls_ca_file": "ca.pem"}, "AUTOSCALER_REDIS_TLS=true"),
        ({"redis_tls": True, "redis_tls_cert_file": "c.pem"}, "go together"),
        ({"redis_url": "http://h:6379"}, "redis://"),
        ({"job_entry_points": ["pipeline.demo"]}, "is not module:function"),
    ],
)
def test_invalid_security_settings_fail_clearly_without_echoing_secrets(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(**fields)
    text = str(caught.value)
    assert message in text
    assert PASSWORD not in text


def test_empty_env_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_REDIS_PASSWORD", "")
    monkeypatch.setenv("AUTOSCALER_KAFKA_SASL_USERNAME", "")
    settings = Settings()
    assert settings.redis_password is None and settings.kafka_sasl_username is None


def test_secrets_never_show_in_repr_or_dumps() -> None:
    settings = sasl(redis_password=PASSWORD)
    for text in (repr(settings), str(settings), settings.model_dump_json(), str(settings.model_dump())):
        assert PASSWORD not in text


def test_settings_env_carries_the_security_settings_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(
        kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-256", kafka_sasl_username="u",
        kafka_sasl_password=PASSWORD, kafka_ssl_ca_file="ca.pem", redis_password="r3dis", redis_username="scaler",
        redis_tls=True, redis_tls_ca_file="rca.pem", job_entry_points=["pipeline.demo:build", "my.job:build"],
    )
    env = settings_env(original)
    assert env["AUTOSCALER_KAFKA_SASL_PASSWORD"] == PASSWORD and env["AUTOSCALER_REDIS_PASSWORD"] == "r3dis"
    assert "AUTOSCALER_KAFKA_SSL_CERT_FILE" not in env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert kafka_security_config(child) == kafka_security_config(original)
    assert redis_client_kwargs(child) == redis_client_kwargs(original)
    assert child.job_entry_points == original.job_entry_points


# ---------------------------------------------------------------- job entry points


def test_entry_point_allowlist() -> None:
    settings = Settings()
    assert check_entry_point("pipeline.demo:build", settings) == "pipeline.demo:build"
    with pytest.raises(EntryPointNotAllowed, match="AUTOSCALER_JOB_ENTRY_POINTS"):
        check_entry_point("os:system", settings)
    assert check_entry_point("my.job:build", Settings(job_entry_points=["my.job:build"])) == "my.job:build"


@pytest.mark.parametrize("value", ["pipeline.demo:build, my.job:build", '["pipeline.demo:build", "my.job:build"]'])
def test_entry_points_from_env(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AUTOSCALER_JOB_ENTRY_POINTS", value)
    assert Settings().job_entry_points == ["pipeline.demo:build", "my.job:build"]


def test_runner_refuses_an_unlisted_entry_point_before_importing_it(tmp_path: Path) -> None:
    from pipeline.restart import RestartFromCheckpoint, SparkJobConfig

    config = SparkJobConfig(job_id="j", entry_point="no_such_module_anywhere:build", checkpoint_dir=tmp_path,
                            settings=Settings())
    # Refused by name: an import attempt would have raised ModuleNotFoundError instead.
    with pytest.raises(EntryPointNotAllowed, match="AUTOSCALER_JOB_ENTRY_POINTS"):
        RestartFromCheckpoint(config)


def test_job_cli_refuses_an_unlisted_entry_point(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agent.job_cli import job_app

    result = CliRunner().invoke(job_app, [
        "run", "--job-id", "j", "--checkpoint-dir", str(tmp_path), "--entry", "os:system",
    ])
    assert result.exit_code == 2
    assert "AUTOSCALER_JOB_ENTRY_POINTS" in result.output


def test_a_rescale_command_cannot_name_code() -> None:
    # Its only free text is the decision id; extra fields (an entry point, a module) are rejected.
    assert set(RescaleCommand.model_fields) == {
        "schema_version", "decision_id", "job_id", "to_parallelism", "fencing_token", "issued_at",
    }
    with pytest.raises(ValidationError):
        RescaleCommand.model_validate({"decision_id": "d", "job_id": "j", "to_parallelism": 2, "fencing_token": 1,
                                       "entry_point": "os:system"})


def test_read_kafka_refuses_a_secured_broker() -> None:
    from pipeline.job import JobContext

    ctx = JobContext(job_id="j", parallelism=1, checkpoint_dir="c", pause_file="p", bootstrap="h:9092",
                     kafka_security=kafka_security_config(sasl()))
    with pytest.raises(NotImplementedError, match="SASL/SSL"):
        ctx.read_kafka(None, "topic")  # type: ignore[arg-type]

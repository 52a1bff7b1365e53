"""Settings for every process of the autoscaler, read from `AUTOSCALER_*` environment variables."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
KafkaSaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

# The job entry points shipped in this repository (the workload suite, `pipeline.workloads`; a test
# keeps the two lists one); `autoscaler job run` starts no other unless AUTOSCALER_JOB_ENTRY_POINTS lists it.
DEFAULT_JOB_ENTRY_POINTS = (
    "pipeline.demo:build",
    "pipeline.workloads.stateful:window_agg",
    "pipeline.workloads.stateful:dedup",
    "pipeline.workloads.stateful:join",
    "pipeline.workloads.nexmark_queries:q1",
    "pipeline.workloads.nexmark_queries:q2",
    "pipeline.workloads.nexmark_queries:q5",
    "pipeline.workloads.nexmark_queries:q8",
    "pipeline.workloads.nexmark_queries:q11",
)


class Topics(BaseModel):
    """Kafka topic names; each is overridable, e.g. `AUTOSCALER_TOPICS__METRICS=my.metrics`."""

    metrics: str = "autoscaler.metrics"
    windows: str = "autoscaler.windows"
    analyses: str = "autoscaler.analyses"
    decisions: str = "autoscaler.decisions"
    commands: str = "autoscaler.commands"
    runner_reports: str = "autoscaler.runner-reports"
    scaling_events: str = "autoscaler.scaling-events"
    dead_letter: str = "autoscaler.dead-letter"

    def all(self) -> list[str]:
        return list(self.model_dump().values())


class Settings(BaseSettings):
    # hide_input_in_errors: a validation error would otherwise print the raw input, secrets included.
    model_config = SettingsConfigDict(
        env_prefix="AUTOSCALER_", env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = Field(
        False, description="The knowledge base is a Redis Cluster (`redis_url` names one of its nodes): one job's "
        "keys share a hash slot, the keys every job shares another.")
    topics: Topics = Field(default_factory=Topics)
    topic_partitions: int = Field(8, ge=1, description="Partitions of the topics the autoscaler creates.")

    app_id: str = Field("autoscaler", description="Faust application id: the consumer-group prefix.")
    loop_interval_s: float = Field(10.0, gt=0, description="Window length in metric time.")
    window_spread: bool = Field(
        True, description="Each job's windows start at a phase of its own within the interval (from its id), so the "
        "windows of thousands of jobs do not all close in the same second; off: every window starts on a "
        "multiple of the interval.")
    max_message_bytes: int = Field(64 * 1024, ge=1024, description="Larger metric reports are dead-lettered.")
    max_clock_skew_s: float = Field(
        300.0, ge=0, description="Reports stamped further in the future than this are dead-lettered."
    )

    # Defaults for per-job configuration (overridable per job in knowledge).
    target_utilization: float = Field(0.7, gt=0, le=1)
    min_parallelism: int = Field(1, ge=1)
    max_parallelism: int = Field(32, ge=1)
    catch_up_duration_s: float = Field(300.0, gt=0, description="Time allowed to drain a backlog.")
    rescale_timeout_s: float = Field(180.0, gt=0, description="Execution lock expiry for one rescale.")
    slot_quota: int | None = Field(
        None, ge=1, description="Most task slots all autoscaled jobs may hold together; scale-ups are trimmed to it."
    )

    # Knowledge bounds: per-job lists are trimmed to these lengths.
    history_length: int = Field(720, ge=10)

    # Faust worker tuning; short timeouts keep consumer-group joins fast (see README, Kafka notes).
    broker_session_timeout_s: float = 10.0
    broker_heartbeat_interval_s: float = 1.0
    broker_max_poll_interval_s: float = 10.0
    broker_fetch_max_wait_ms: int = Field(
        50, ge=1, le=1500, description="How long a fetch waits for data; bounds each hop's latency on tansu."
    )
    web_port: int = Field(6066, description="Faust web port; /metrics serves Prometheus metrics.")
    web_host: str = Field(
        "127.0.0.1", description="Address the agents' web server listens on; 0.0.0.0 opens it to every interface."
    )
    web_token: SecretStr | None = Field(
        None, description="Bearer token the agents' pages and the dashboard require (none: no authentication)."
    )
    web_token_file: str | None = Field(
        None, description="File holding the bearer token, instead of AUTOSCALER_WEB_TOKEN."
    )
    log_level: str = "info"
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="The agents' event loop: uvloop (libuv's, less CPU per message) or Python's asyncio.")

    # Kafka security (confluent-kafka and Faust clients). PLAINTEXT, no auth: today's default.
    kafka_security_protocol: KafkaSecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: KafkaSaslMechanism = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_file: str | None = Field(None, description="PEM CA bundle that signs the brokers' certificates.")
    kafka_ssl_cert_file: str | None = Field(None, description="PEM client certificate (mutual TLS).")
    kafka_ssl_key_file: str | None = Field(None, description="PEM private key of the client certificate.")
    kafka_ssl_key_password: SecretStr | None = None

    # Redis security. A password or user in AUTOSCALER_REDIS_URL also works; these keep it out of the URL.
    redis_username: str | None = Field(None, description="Redis ACL user; default: the `default` user.")
    redis_password: SecretStr | None = None
    redis_tls: bool = Field(False, description="TLS to Redis; also on with a rediss:// URL.")
    redis_tls_ca_file: str | None = None
    redis_tls_cert_file: str | None = None
    redis_tls_key_file: str | None = None

    job_entry_points: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_JOB_ENTRY_POINTS),
        description="module:function job entry points `autoscaler job run` may start (comma-separated or JSON).",
    )

    _web_token_from_file: SecretStr | None = PrivateAttr(None)

    @field_validator("kafka_sasl_password", "kafka_ssl_key_password", "redis_password", "web_token", mode="before")
    @classmethod
    def _empty_secret_is_unset(cls, value: Any) -> Any:
        # An empty env var means "no secret", not an empty password.
        if value == "" or (isinstance(value, SecretStr) and not value.get_secret_value()):
            return None
        return value

    @field_validator(
        "kafka_sasl_username", "kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file",
        "redis_username", "redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file", "web_token_file",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("job_entry_points", mode="before")
    @classmethod
    def _parse_entry_points(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("job_entry_points")
    @classmethod
    def _entry_points_are_module_function(cls, value: list[str]) -> list[str]:
        for spec in value:
            module_name, sep, attr = spec.partition(":")
            if not sep or not module_name or not attr:
                raise ValueError(f"AUTOSCALER_JOB_ENTRY_POINTS: {spec!r} is not module:function")
        return value

    @model_validator(mode="after")
    def _security_is_consistent(self) -> Settings:
        # Messages name settings, never values: they end up in logs.
        protocol = self.kafka_security_protocol
        sasl = protocol.startswith("SASL_")
        tls = protocol in ("SSL", "SASL_SSL")
        if sasl and (not self.kafka_sasl_username or self.kafka_sasl_password is None):
            raise ValueError(
                f"AUTOSCALER_KAFKA_SECURITY_PROTOCOL={protocol} needs AUTOSCALER_KAFKA_SASL_USERNAME "
                "and AUTOSCALER_KAFKA_SASL_PASSWORD"
            )
        if not sasl and (self.kafka_sasl_username or self.kafka_sasl_password is not None):
            raise ValueError(
                "AUTOSCALER_KAFKA_SASL_USERNAME/PASSWORD are set but AUTOSCALER_KAFKA_SECURITY_PROTOCOL is "
                f"{protocol}; use SASL_PLAINTEXT or SASL_SSL"
            )
        ssl_files = (self.kafka_ssl_ca_file, self.kafka_ssl_cert_file, self.kafka_ssl_key_file,
                     self.kafka_ssl_key_password)
        if not tls and any(f is not None for f in ssl_files):
            raise ValueError(
                f"AUTOSCALER_KAFKA_SSL_* are set but AUTOSCALER_KAFKA_SECURITY_PROTOCOL is {protocol}; "
                "use SSL or SASL_SSL"
            )
        if (self.kafka_ssl_cert_file is None) != (self.kafka_ssl_key_file is None):
            raise ValueError("AUTOSCALER_KAFKA_SSL_CERT_FILE and AUTOSCALER_KAFKA_SSL_KEY_FILE go together")
        if self.kafka_ssl_key_password is not None and self.kafka_ssl_key_file is None:
            raise ValueError("AUTOSCALER_KAFKA_SSL_KEY_PASSWORD needs AUTOSCALER_KAFKA_SSL_KEY_FILE")

        url = urlsplit(self.redis_url)
        if url.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("AUTOSCALER_REDIS_URL must be a redis://, rediss:// or unix:// URL")
        if self.redis_password is not None and url.password:
            raise ValueError("give the Redis password in AUTOSCALER_REDIS_URL or AUTOSCALER_REDIS_PASSWORD, not both")
        if self.redis_username and self.redis_password is None and not url.password:
            raise ValueError("AUTOSCALER_REDIS_USERNAME needs a password (AUTOSCALER_REDIS_PASSWORD)")
        if not self.redis_uses_tls and any(
            f is not None for f in (self.redis_tls_ca_file, self.redis_tls_cert_file, self.redis_tls_key_file)
        ):
            raise ValueError("AUTOSCALER_REDIS_TLS_* files are set but TLS is off: set AUTOSCALER_REDIS_TLS=true")
        if self.redis_tls and url.scheme == "unix":
            raise ValueError("AUTOSCALER_REDIS_TLS needs a redis:// or rediss:// URL, not a unix socket")
        if (self.redis_tls_cert_file is None) != (self.redis_tls_key_file is None):
            raise ValueError("AUTOSCALER_REDIS_TLS_CERT_FILE and AUTOSCALER_REDIS_TLS_KEY_FILE go together")
        self._web_token_from_file = self._read_web_token_file()
        return self

    def _read_web_token_file(self) -> SecretStr | None:
        if self.web_token_file is None:
            return None
        if self.web_token is not None:
            raise ValueError("give the web token in AUTOSCALER_WEB_TOKEN or AUTOSCALER_WEB_TOKEN_FILE, not both")
        try:
            token = Path(self.web_token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeError) as exc:
            raise ValueError(f"AUTOSCALER_WEB_TOKEN_FILE: cannot read {self.web_token_file} ({type(exc).__name__})") \
                from None
        if not token:
            raise ValueError(f"AUTOSCALER_WEB_TOKEN_FILE: {self.web_token_file} is empty")
        return SecretStr(token)

    @property
    def web_bearer_token(self) -> SecretStr | None:
        """The token the web pages require: AUTOSCALER_WEB_TOKEN, or the file's content (read once)."""
        return self.web_token if self.web_token is not None else self._web_token_from_file

    @property
    def redis_uses_tls(self) -> bool:
        return self.redis_tls or self.redis_url.startswith("rediss://")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process these settings."""
    env = {
        "AUTOSCALER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "AUTOSCALER_REDIS_URL": settings.redis_url,
        "AUTOSCALER_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "AUTOSCALER_APP_ID": settings.app_id,
        "AUTOSCALER_WEB_PORT": str(settings.web_port),
        "AUTOSCALER_WEB_HOST": settings.web_host,
        "AUTOSCALER_LOOP_INTERVAL_S": str(settings.loop_interval_s),
        "AUTOSCALER_WINDOW_SPREAD": str(settings.window_spread).lower(),
        "AUTOSCALER_EVENT_LOOP": settings.event_loop,
        "AUTOSCALER_LOG_LEVEL": "info",
    }
    for name, topic in settings.topics.model_dump().items():
        env[f"AUTOSCALER_TOPICS__{name.upper()}"] = topic
    if settings.redis_cluster:
        env["AUTOSCALER_REDIS_CLUSTER"] = "true"
    # Security settings only when set, so a child keeps today's defaults otherwise. Secrets go by
    # environment: not on the command line, where any user could read them in the process list.
    optional: dict[str, str | SecretStr | None] = {
        "KAFKA_SASL_USERNAME": settings.kafka_sasl_username,
        "KAFKA_SASL_PASSWORD": settings.kafka_sasl_password,
        "KAFKA_SSL_CA_FILE": settings.kafka_ssl_ca_file,
        "KAFKA_SSL_CERT_FILE": settings.kafka_ssl_cert_file,
        "KAFKA_SSL_KEY_FILE": settings.kafka_ssl_key_file,
        "KAFKA_SSL_KEY_PASSWORD": settings.kafka_ssl_key_password,
        "REDIS_USERNAME": settings.redis_username,
        "REDIS_PASSWORD": settings.redis_password,
        "REDIS_TLS_CA_FILE": settings.redis_tls_ca_file,
        "REDIS_TLS_CERT_FILE": settings.redis_tls_cert_file,
        "REDIS_TLS_KEY_FILE": settings.redis_tls_key_file,
        "WEB_TOKEN": settings.web_token,
        "WEB_TOKEN_FILE": settings.web_token_file,
    }
    if settings.kafka_security_protocol != "PLAINTEXT":
        env["AUTOSCALER_KAFKA_SECURITY_PROTOCOL"] = settings.kafka_security_protocol
        env["AUTOSCALER_KAFKA_SASL_MECHANISM"] = settings.kafka_sasl_mechanism
    if settings.redis_tls:
        env["AUTOSCALER_REDIS_TLS"] = "true"
    for name, value in optional.items():
        if value is not None:
            env[f"AUTOSCALER_{name}"] = value.get_secret_value() if isinstance(value, SecretStr) else value
    if list(settings.job_entry_points) != list(DEFAULT_JOB_ENTRY_POINTS):
        env["AUTOSCALER_JOB_ENTRY_POINTS"] = json.dumps(settings.job_entry_points)
    return env

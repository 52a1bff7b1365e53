"""Settings for every process of the autoscaler, read from `AUTOSCALER_*` environment variables."""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    model_config = SettingsConfigDict(env_prefix="AUTOSCALER_", env_nested_delimiter="__", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    topics: Topics = Field(default_factory=Topics)
    topic_partitions: int = Field(8, ge=1, description="Partitions of the topics the autoscaler creates.")

    app_id: str = Field("autoscaler", description="Faust application id: the consumer-group prefix.")
    loop_interval_s: float = Field(10.0, gt=0, description="Window length in metric time.")
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
    log_level: str = "info"


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
        "AUTOSCALER_LOOP_INTERVAL_S": str(settings.loop_interval_s),
        "AUTOSCALER_LOG_LEVEL": "info",
    }
    for name, topic in settings.topics.model_dump().items():
        env[f"AUTOSCALER_TOPICS__{name.upper()}"] = topic
    return env

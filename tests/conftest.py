"""Shared fixtures: real services on free ports, started and stopped by the test session."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.settings import Settings, Topics
from stack.processes import Service, free_port, start_broker, start_redis
from stack.services import AgentWorker, start_agents


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = start_broker(log_path=tmp_path_factory.mktemp("broker") / "broker.log")
    yield service
    service.stop()


@pytest.fixture(scope="session")
def redis_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = start_redis(log_path=tmp_path_factory.mktemp("redis") / "redis.log")
    yield service
    service.stop()


def unique_topics() -> Topics:
    """Topics of one test, so tests sharing a broker never see each other's records."""
    run = uuid.uuid4().hex[:6]
    return Topics(**{name: f"t{run}.{topic}" for name, topic in Topics().model_dump().items()})


@pytest.fixture
def settings(broker: Service, redis_service: Service) -> Settings:
    return Settings(
        kafka_bootstrap=f"127.0.0.1:{broker.port}",
        redis_url=f"redis://127.0.0.1:{redis_service.port}/0",
        topics=unique_topics(),
        topic_partitions=4,
        app_id=f"autoscaler-{uuid.uuid4().hex[:6]}",
        web_port=free_port(),
        loop_interval_s=10.0,
    )


@pytest.fixture
def agents(settings: Settings, tmp_path: Path) -> Iterator[AgentWorker]:
    worker = start_agents(settings, tmp_path / "agents.log")
    yield worker
    worker.stop()


def wait_until(predicate, timeout: float, interval: float = 0.1, message: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")

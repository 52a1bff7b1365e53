"""Shared fixtures: real services on free ports, started and stopped by the test session."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contracts.settings import Settings, Topics
from stack.processes import Service, free_port, start_broker, start_redis
from stack.services import AgentWorker, start_agents
from tests.no_skips_in_ci import pytest_runtest_makereport  # noqa: F401 - the hook: no skip passes CI

# Services a wider-scoped fixture keeps for later tests; anything else a test started must be gone when it ends.
_SHARED_SERVICES = ("tansu", "redis-server")


def _started_processes() -> dict[int, str]:
    """Processes a test may have left: pytest's descendants, and any agent or Spark process (a process
    group leader that died leaves its children to init), by pid. The JVM behind a SparkSession this
    pytest process built, and its Python workers, live as long as pytest does and are not counted."""
    me = os.getpid()
    found: dict[int, str] = {}
    for process in psutil.process_iter(["cmdline"]):
        try:
            if process.pid == me or process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            lineage = process.parents()
            ours = any(parent.pid == me for parent in lineage)
            gateway = any(parent.ppid() == me and parent.name() == "java" for parent in [process, *lineage])
            if gateway or any(name in cmdline for name in _SHARED_SERVICES):
                continue
            if ours or "-m agent" in cmdline or "pyspark" in cmdline:
                found[process.pid] = cmdline
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A process a test starts (agents, a Spark job, a load generator) stops with it: one left running
    takes the 2 cores from every later test, whose figures then mean nothing. A leftover is killed and
    the test errors with its command line."""
    if "unit" in request.node.path.parts:
        yield
        return
    before = set(_started_processes())

    def leftovers() -> dict[int, str]:
        return {pid: cmd for pid, cmd in _started_processes().items() if pid not in before}

    yield
    deadline = time.monotonic() + 5.0
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers()
    for pid in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert not left, f"processes outlived the test (killed now): {[cmd[:200] for cmd in left.values()]}"


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
        # These tests build reports on window boundaries (multiples of the interval). Windows spread
        # over the interval, the default, run in the reliability tests (tests/reliability/helpers.py,
        # test_load.py) and the window rules' unit tests.
        window_spread=False,
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

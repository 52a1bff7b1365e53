"""Redis AUTH against a real redis-server started with a password, and no secret in any output:
the agents' log, the output topics (decisions, scaling events, dead letters) and /ready."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.exceptions
from confluent_kafka import Consumer, TopicPartition

from contracts.dead_letters import DeadLetter
from contracts.decisions import ScalingDecision
from contracts.settings import Settings
from infra.kafka import group_consumer_config
from infra.security import redact
from knowledge import RedisKnowledge
from stack.embedded import Stack
from stack.processes import Service, free_port, spawn, start_redis, stop_pid, wait_for_port
from stack.services import start_agents
from tests.conftest import unique_topics, wait_until
from tests.integration.kafka_helpers import Collector, send
from tests.integration.test_agents import register, three_operator_reports

pytestmark = pytest.mark.integration


@pytest.fixture
def password() -> str:
    # Unique per test, so finding it anywhere can only mean a leak.
    return f"pw-{uuid.uuid4().hex}"


@pytest.fixture
def secured_redis(password: str, tmp_path: Path) -> Iterator[Service]:
    service = start_redis(free_port(), tmp_path / "redis.log", password=password)
    yield service
    service.stop()


def secured_settings(broker: Service, redis_service: Service, password: str | None, **extra: object) -> Settings:
    return Settings(
        kafka_bootstrap=f"127.0.0.1:{broker.port}",
        redis_url=f"redis://127.0.0.1:{redis_service.port}/0",
        redis_password=password,
        topics=unique_topics(),
        topic_partitions=4,
        app_id=f"autoscaler-{uuid.uuid4().hex[:6]}",
        web_port=free_port(),
        **extra,
    )


@pytest.mark.parametrize("where", ["setting", "url"])
def test_knowledge_with_the_password_works(broker: Service, secured_redis: Service, password: str, where: str) -> None:
    settings = secured_settings(broker, secured_redis, password if where == "setting" else None)
    if where == "url":
        settings = settings.model_copy(update={"redis_url": f"redis://:{password}@127.0.0.1:{secured_redis.port}/0"})

    async def go() -> tuple[set[str], int]:
        knowledge = RedisKnowledge(settings)
        try:
            await knowledge.register_job("auth-job", {"max_parallelism": "12"})
            return await knowledge.jobs(), (await knowledge.job_config("auth-job")).max_parallelism
        finally:
            await knowledge.close()

    jobs, max_parallelism = asyncio.run(go())
    assert "auth-job" in jobs and max_parallelism == 12


@pytest.mark.parametrize("given", ["wrong", None])
def test_knowledge_without_the_right_password_fails_with_an_auth_error(
    broker: Service, secured_redis: Service, password: str, given: str | None
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}" if given else None
    settings = secured_settings(broker, secured_redis, wrong)

    async def go() -> None:
        knowledge = RedisKnowledge(settings)
        try:
            await knowledge.ping()
        finally:
            await knowledge.close()

    with pytest.raises(redis.exceptions.AuthenticationError) as caught:
        asyncio.run(go())
    text = redact(str(caught.value), settings)
    assert password not in text
    if wrong:
        assert wrong not in text


def tls_files(folder: Path) -> dict[str, Path]:
    """A test CA and a server certificate it signed for 127.0.0.1 (PEM)."""
    files = {name: folder / f"{name}.pem" for name in ("ca", "ca-key", "server", "server-key")}
    csr, ext = folder / "server.csr", folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files["ca-key"]), "-out",
            str(files["ca"]), "-days", "1", "-subj", "/CN=autoscaler-test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files["server-key"]), "-out", str(csr),
            "-subj", "/CN=localhost")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca"]), "-CAkey", str(files["ca-key"]),
            "-CAcreateserial", "-out", str(files["server"]), "-days", "1", "-extfile", str(ext))
    return files


def test_redis_tls_with_auth(broker: Service, password: str, tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    # No skip: a TLS test that skips tests nothing (./dev setup installs both).
    assert binary and shutil.which("openssl"), "the Redis TLS test needs redis-server and openssl: run ./dev setup"
    files = tls_files(tmp_path)
    port = free_port()
    # TLS only (--port 0): a client that does not speak TLS cannot get in.
    process = spawn("redis-tls", [
        binary, "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(files["server"]),
        "--tls-key-file", str(files["server-key"]), "--tls-ca-cert-file", str(files["ca"]),
        "--tls-auth-clients", "no", "--requirepass", password, "--save", "", "--appendonly", "no",
    ], tmp_path / "redis-tls.log")
    try:
        wait_for_port("127.0.0.1", port)
        base = dict(kafka_bootstrap=f"127.0.0.1:{broker.port}", redis_url=f"redis://127.0.0.1:{port}/0",
                    redis_password=password)
        settings = Settings(**base, redis_tls=True, redis_tls_ca_file=str(files["ca"]))

        async def go(s: Settings) -> set[str]:
            knowledge = RedisKnowledge(s)
            try:
                await knowledge.register_job("tls-job")
                return await knowledge.jobs()
            finally:
                await knowledge.close()

        assert "tls-job" in asyncio.run(go(settings))
        assert Stack(settings)._redis_answers()  # the synchronous client gets the same TLS settings
        with pytest.raises(redis.exceptions.ConnectionError):
            asyncio.run(go(Settings(**base)))  # plaintext to a TLS port
    finally:
        stop_pid(process.pid, process=process)


def ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=3) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def all_records(settings: Settings, topics: list[str], idle_s: float = 3.0) -> list[bytes]:
    """Every record (key and value) of `topics`, read from offset 0 of each partition."""
    consumer = Consumer(group_consumer_config(settings, f"test-{uuid.uuid4().hex[:8]}", "earliest"))
    records: list[bytes] = []
    try:
        # assign(), not subscribe(): no group join to wait for, and every partition from its start.
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(t, p, 0) for t in topics if t in metadata for p in metadata[t].partitions])
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                records.append((msg.key() or b"") + b"\x00" + (msg.value() or b""))
                last = time.monotonic()
    finally:
        consumer.close()
    return records


def test_agents_with_redis_auth_leak_the_password_nowhere(
    broker: Service, secured_redis: Service, password: str, tmp_path: Path
) -> None:
    settings = secured_settings(broker, secured_redis, password)
    log_path = tmp_path / "agents.log"
    # The password reaches the agents only through settings_env (AUTOSCALER_REDIS_PASSWORD).
    worker = start_agents(settings, log_path)
    try:
        wait_until(lambda: ready(worker.web_port)[0] == 200, timeout=60, message="the agents to be ready")
        job = "secured-job"
        register(settings, job, policy="reactive", per_operator="true", target_utilization="1.0",
                 utilization_band="0",
                 max_parallelism="64", catch_up_duration_s="1e9", stabilization_windows="0", min_samples="1")
        start = math.floor(time.time() / 10) * 10 - 100
        decisions = Collector(settings, settings.topics.decisions)
        letters = Collector(settings, settings.topics.dead_letter)
        reports = [(job.encode(), r.to_bytes()) for r in three_operator_reports(job, start, 11)]
        send(settings, settings.topics.metrics, [*reports, (job.encode(), b"{not json")])
        got = decisions.until(ScalingDecision.model_validate_json, lambda d: len(d) >= 1, timeout=60)
        letters.until(DeadLetter.model_validate_json, lambda d: len(d) >= 1, timeout=60)
        decisions.close()
        letters.close()
        assert got[0].job_id == job  # the agents read and wrote knowledge with the password

        status, body = ready(worker.web_port)
        assert status == 200 and json.loads(body)["ready"] and password not in body

        # Knowledge goes away: /ready reports the error and the agents log that they wait.
        secured_redis.stop()
        status, body = wait_until(lambda: (r := ready(worker.web_port))[0] == 503 and r, timeout=30,
                                  message="/ready to report the outage")
        assert json.loads(body)["error"] and password not in body
        send(settings, settings.topics.metrics,
             [(job.encode(), three_operator_reports(job, start + 20, 1)[0].to_bytes())])
        wait_until(lambda: "degraded" in log_path.read_text(errors="replace"), timeout=30,
                   message="the agents to log that they wait for knowledge")
    finally:
        worker.stop()

    log = log_path.read_text(errors="replace")
    assert "degraded" in log and password not in log
    records = all_records(settings, [settings.topics.decisions, settings.topics.scaling_events,
                                     settings.topics.dead_letter, settings.topics.commands])
    assert any(got[0].decision_id.encode() in r for r in records)
    assert any(b"malformed_json" in r for r in records)
    assert not [r for r in records if password.encode() in r]

"""An agent worker's web pages against a real broker and Redis: /ready answers 200 only once the
worker has its partitions (none is an answer too) and has fetched; the pages listen on 127.0.0.1
and, with a token set, answer 401 without it."""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer, TopicPartition
from pydantic import SecretStr

from agent.dashboard import Dashboard
from contracts.decisions import ScalingDecision
from contracts.settings import Settings, settings_env
from infra.kafka import group_consumer_config
from knowledge.memory import MemoryKnowledge
from stack.processes import free_port, spawn, stop_pid
from stack.services import autoscaler_argv, readiness, start_agents, start_together
from tests.conftest import wait_until
from tests.integration.kafka_helpers import send
from tests.integration.test_agents import register, three_operator_reports

pytestmark = pytest.mark.integration

TOKEN = "t0ken-of-the-agents-pages"


def test_ready_only_once_partitions_are_assigned_and_fetched(settings: Settings, tmp_path: Path) -> None:
    job = "ready-job"
    register(settings, job, policy="reactive", per_operator="true", target_utilization="1.0", utilization_band="0",
             max_parallelism="64", catch_up_duration_s="1e9", stabilization_windows="0", min_samples="1")
    process = spawn("agents", autoscaler_argv("agents"), tmp_path / "agents.log", settings_env(settings),
                    cwd=tmp_path)
    answers: list[tuple[int, dict[str, Any]]] = []
    try:
        deadline = time.monotonic() + 60
        while (not answers or answers[-1][0] != 200) and time.monotonic() < deadline:
            answers.append(readiness(settings.web_port, settings))
            time.sleep(0.02)
        status, body = answers[-1]
        assert status == 200 and body["ready"], answers[-5:]
        # Before: the page answered, Redis too, but the worker had no partitions yet.
        starting = [b for s, b in answers if s == 503]
        assert starting and all(b["status"] == "starting" for b in starting), answers
        assert starting[0]["waiting_for"] == "partition assignment"
        assert body["partitions"] == 4 * 5  # metrics, windows, analyses, decisions, runner reports

        # Ready means ready: a window sent now is decided at once, not after the group join. (Read
        # by assign(), not a group of our own, whose join would take seconds too.)
        consumer = Consumer(group_consumer_config(settings, f"test-{uuid.uuid4().hex[:8]}", "earliest"))
        consumer.assign([TopicPartition(settings.topics.decisions, p, 0) for p in range(settings.topic_partitions)])
        consumer.poll(0.5)
        start = math.floor(time.time() / 10) * 10 - 100
        sent_at = time.monotonic()
        send(settings, settings.topics.metrics,
             [(job.encode(), r.to_bytes()) for r in three_operator_reports(job, start, 11)])
        try:
            decision = wait_until(lambda: (m := consumer.poll(0.1)) is not None and not m.error() and m, timeout=30,
                                  interval=0, message="the first decision")
        finally:
            consumer.close()
        decided_after = time.monotonic() - sent_at
        assert ScalingDecision.model_validate_json(decision.value()).job_id == job
        assert decided_after < 2.0, f"the first decision took {decided_after:.1f} s after /ready said 200"
    finally:
        stop_pid(process.pid, timeout=15, process=process)


def test_a_worker_without_partitions_is_ready(settings: Settings, tmp_path: Path) -> None:
    # One partition, two monitor workers in one consumer group: one of them gets nothing to read.
    settings = settings.model_copy(update={"topic_partitions": 1})
    # Started together, so they join the group together.
    workers = start_together([partial(start_agents, settings, tmp_path / f"monitor-{name}.log", ["monitor"],
                                      web_port=free_port()) for name in ("a", "b")])
    try:
        def partitions() -> list[int] | None:
            answers = [readiness(w.web_port, settings) for w in workers]
            counts = sorted(body.get("partitions", -1) for status, body in answers if status == 200)
            return counts if counts == [0, 1] else None

        wait_until(partitions, timeout=30, message="one worker with the partition, one with none, both ready")
    finally:
        for worker in workers:
            worker.stop()


def get(port: int, path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers),
                                    timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_pages_listen_on_loopback_and_want_the_token(settings: Settings, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"web_token": SecretStr(TOKEN)})
    # start_agents waits on /ready with the settings' token: it answers 200 with it.
    worker = start_agents(settings, tmp_path / "agents.log")
    try:
        listening = {c.laddr.ip for c in psutil.Process(worker.process.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == worker.web_port}
        assert listening == {"127.0.0.1"}
        for path in ("/ready", "/metrics", "/"):  # ours and Faust's own
            assert get(worker.web_port, path) == 401, path
            assert get(worker.web_port, path, "wrong") == 401, path
        assert get(worker.web_port, "/metrics", TOKEN) == 200
        status, body = readiness(worker.web_port, settings)
        assert status == 200 and body["ready"]

        # The dashboard sends the same token to the agents it shows.
        url = f"http://127.0.0.1:{worker.web_port}"
        assert Dashboard(settings, [url], MemoryKnowledge(settings))._check_agent(url)["status"] == "ok"
        other = settings.model_copy(update={"web_token": None})
        refused = Dashboard(other, [url], MemoryKnowledge(other))._check_agent(url)
        assert refused["status"] == "degraded" and refused["detail"].startswith("HTTP 401")
    finally:
        worker.stop()
    assert TOKEN not in worker.log()

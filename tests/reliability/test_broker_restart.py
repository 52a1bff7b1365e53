"""Broker loss: the Kafka-protocol broker is stopped and started again, empty (the embedded broker
keeps nothing on disk). The agents reconnect, create their topics again and carry on deciding."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from stack.processes import Service, free_port, start_broker
from stack.services import readiness, register_jobs, start_agents
from tests.conftest import wait_until
from tests.integration.test_agents import accepted_reports, prometheus_samples
from tests.reliability.helpers import EAGER, Ledger, ReportStream, TopicLog, settings_for

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


def rejected_reports(port: int) -> float:
    return sum(value for _, value in prometheus_samples(port, "autoscaler_reports_rejected_total"))


def settled(read: Callable[[], float], quiet_s: float = 2.0, timeout_s: float = 20.0) -> float:
    """The value `read` gives once it has not changed for `quiet_s`."""
    value, since, deadline = read(), time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.25)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


def test_agents_reconnect_and_recreate_their_topics_after_a_broker_restart(
    redis_service: Service, tmp_path: Path
) -> None:
    port = free_port()
    broker = start_broker(port, tmp_path / "broker.log")
    settings = settings_for(port, redis_service.port)
    jobs = [f"restart-{uuid.uuid4().hex[:4]}-{i}" for i in range(2)]
    register_jobs(settings, jobs, **EAGER, mode="recommend")
    worker = start_agents(settings, tmp_path / "agents.log")
    ledger = Ledger(settings)
    try:
        with ReportStream(settings, jobs, speedup=10.0) as stream:
            wait_until(lambda: (ledger.poll(), len(ledger.decisions()) >= 6)[1], timeout=90,
                       message="decisions before the restart")
            broker.stop()
            stopped_at = time.time()
            produced_before = sum(len(stamps) for stamps in stream.sent.values())  # all the old broker got
            # Reports the monitor fetched from the old broker may still be in its hands: count from when
            # its counters have stopped moving, or those would be taken for reports on the new broker.
            accepted_before = settled(lambda: accepted_reports(worker.web_port))
            rejected_before = rejected_reports(worker.web_port)
            time.sleep(max(0.0, 3 - (time.time() - stopped_at)))
            broker = start_broker(port, tmp_path / "broker.log")
            restarted_at = time.time()
            # The new broker is empty: whatever the agents publish now, they published after it came.
            before = len(ledger.decisions())
            wait_until(lambda: (ledger.poll(), len(ledger.decisions()) >= before + 6)[1], timeout=120,
                       message="decisions from the restarted broker")
            first_after = min(at for at, _ in ledger.decisions_received()[before:]) - restarted_at
            assert worker.process.poll() is None, "the agents died with the broker"
            assert readiness(worker.web_port, timeout=3)[0] == 200
        assert not stream.failed, stream.failed
        counts: dict[str, float] = {}
        # Every report on the new broker (it holds only those) must be counted, none skipped for its
        # reused offset. The monitor may also still hold reports from the old broker whose windows
        # waited for the new broker's acknowledgement; it counts them once published: at most those
        # the old broker got and the monitor had not counted when it went quiet.
        metrics_log = TopicLog(settings, settings.topics.metrics)
        try:
            on_new_broker = int(settled(lambda: (metrics_log.poll(0.5), len(metrics_log.records))[1]))
        finally:
            metrics_log.close()
        in_hand = produced_before - accepted_before - rejected_before

        def all_used() -> bool:
            counts.update(accepted=accepted_reports(worker.web_port) - accepted_before, on_broker=on_new_broker,
                          rejected=rejected_reports(worker.web_port) - rejected_before, in_hand=in_hand)
            return on_new_broker <= counts["accepted"] + counts["rejected"] <= on_new_broker + in_hand

        try:
            wait_until(all_used, timeout=30, message="every report on the new broker accepted")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {counts}") from None
        after = [d for _, d in ledger.decisions_received()[before:]]
        # Decisions follow the reports sent after the restart, window after window.
        ends = sorted({d.window_end for d in after if d.job_id == jobs[0]})
        assert len(ends) >= 3 and all(b - a == settings.loop_interval_s for a, b in itertools.pairwise(ends))
        print(f"\nbroker restart: down {restarted_at - stopped_at:.0f} s; first decision {first_after:.1f} s after "
              "it came back")
    finally:
        ledger.close()
        worker.stop()
        broker.stop()

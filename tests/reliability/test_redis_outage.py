"""Redis outage: knowledge goes away and comes back. The agents stay up, say they are degraded,
decide nothing meanwhile and then continue where they were: no window is left without its decision."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stack.processes import Service, free_port, start_redis
from stack.services import readiness, register_jobs, start_agents
from tests.conftest import wait_until
from tests.reliability.helpers import (
    EAGER,
    Ledger,
    ReportStream,
    audit,
    missing_decisions,
    settings_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


def test_agents_wait_out_a_redis_outage_and_resume_without_losing_a_window(broker: Service, tmp_path: Path) -> None:
    redis_port = free_port()
    data = tmp_path / "redis-data"
    redis = start_redis(redis_port, tmp_path / "redis.log", data_dir=data)
    settings = settings_for(broker.port, redis_port)
    jobs = ["outage-a", "outage-b"]
    register_jobs(settings, jobs, **EAGER, mode="recommend")
    worker = start_agents(settings, tmp_path / "agents.log")
    ledger = Ledger(settings)
    try:
        with ReportStream(settings, jobs, speedup=10.0) as stream:
            wait_until(lambda: (ledger.poll(), len(ledger.decisions()) >= 6)[1], timeout=90,
                       message="decisions before the outage")
            assert readiness(worker.web_port, timeout=3)[0] == 200

            redis.stop()
            stopped_at = time.time()
            _status, body = wait_until(
                lambda: (r := readiness(worker.web_port, timeout=3))[0] == 503 and r, timeout=20,
                message="readiness to report the outage",
            )
            assert body["status"] == "degraded"
            degraded_at = time.time()
            wait_until(lambda: "degraded" in worker.log(), timeout=20, message="a 'degraded' log line")
            ledger.watch(15)  # longer than the consumer session timeout: the worker must stay in its group
            ledger.poll(1.0)
            during = [d for at, d in ledger.decisions_received() if at > degraded_at + 1.0]
            assert worker.process.poll() is None, "the agents died with Redis"
            assert during == [], f"{len(during)} decisions made without knowledge"

            redis = start_redis(redis_port, tmp_path / "redis.log", data_dir=data)
            restarted_at = time.time()
            wait_until(lambda: readiness(worker.web_port, timeout=3)[0] == 200, timeout=30, message="ready again")
            ready_after = time.time() - restarted_at
            wait_until(lambda: (ledger.poll(), any(at > restarted_at for at, _ in ledger.decisions_received()))[1],
                       timeout=60, message="decisions after Redis returned")
            first_after = min(at for at, _ in ledger.decisions_received() if at > restarted_at) - restarted_at
            ledger.watch(5)
        assert not stream.failed, stream.failed
        wait_until(lambda: (ledger.poll(), not missing_decisions(ledger, stream, settings))[1],
                   timeout=90, message="a decision for every closed window, including those of the outage")
        result = audit(ledger)
        assert result.windows_with_two_decisions == []
        assert "recovered" in worker.log()
        print(f"\nredis outage {restarted_at - stopped_at:.0f} s: {result.decisions} windows decided, 0 lost; "
              f"ready {ready_after:.1f} s and deciding {first_after:.1f} s after Redis returned")
    finally:
        ledger.close()
        worker.stop()
        redis.stop()

"""The four agents against a real broker and Redis: contract (DS2 per operator) and dead letters."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.request

import pytest

from contracts.dead_letters import DeadLetter
from contracts.decisions import ScalingDecision
from contracts.messages import MetricReport, OperatorMetrics, SourceMetrics
from contracts.settings import Settings
from knowledge import RedisKnowledge
from stack.services import AgentWorker
from tests.integration.kafka_helpers import Collector, send

pytestmark = pytest.mark.integration


def register(settings: Settings, job: str, **overrides: str) -> None:
    async def go() -> None:
        knowledge = RedisKnowledge(settings)
        await knowledge.register_job(job, overrides)
        await knowledge.close()

    asyncio.run(go())


def prometheus_samples(port: int, metric: str) -> list[tuple[str, float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [
        (line.split("{", 1)[1].rsplit("}", 1)[0], float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith(metric + "{")
    ]


def accepted_reports(port: int) -> float:
    return sum(value for _, value in prometheus_samples(port, "autoscaler_reports_accepted_total"))


def three_operator_reports(job: str, start: float, seconds: int) -> list[MetricReport]:
    """source -> flatmap -> count, each at parallelism 1 and saturated.

    True rates per instance: source 1,000 rec/s (selectivity 1), flatmap 500 rec/s (selectivity 5),
    count 2,000 rec/s. 3,000 rec/s arrive at the source."""
    reports = []
    for i in range(1, seconds + 1):
        ops = [
            OperatorMetrics(operator_id="source", parallelism=1, records_in=1000, records_out=1000,
                            busy_time_s=1.0, arrival_rate=3000.0),
            OperatorMetrics(operator_id="flatmap", upstream=["source"], parallelism=1, records_in=500,
                            records_out=2500, busy_time_s=1.0),
            OperatorMetrics(operator_id="count", upstream=["flatmap"], parallelism=1, records_in=2000,
                            records_out=2000, busy_time_s=1.0),
        ]
        reports.append(MetricReport(
            job_id=job, timestamp=start + i, interval_s=1.0, parallelism=1, records_in=1000,
            records_out=2000, busy_time_s=3.0,
            source=SourceMetrics(arrival_rate=3000.0, backlog=2000 * i, partitions=12),
            operators=ops,
        ))
    return reports


def test_three_operator_job_gets_ds2_optimal_parallelism_in_one_decision(
    settings: Settings, agents: AgentWorker
) -> None:
    job = "wordcount"
    register(settings, job, policy="reactive", per_operator="true", target_utilization="1.0", utilization_band="0",
             max_parallelism="64", catch_up_duration_s="100", restart_time_s="10", stabilization_windows="0",
             min_samples="1")
    start = math.floor(time.time() / 10) * 10 - 100
    reports = three_operator_reports(job, start, 11)  # the 11th report closes the first window
    decisions = Collector(settings, settings.topics.decisions)
    send(settings, settings.topics.metrics, [(job.encode(), r.to_bytes()) for r in reports])
    got = decisions.until(ScalingDecision.model_validate_json, lambda d: len(d) >= 1, timeout=60)
    decisions.close()
    decision = got[0]
    # DS2 Eq. 7 with the catch-up: 3,000 rec/s plus the backlog (18,000-20,000 records, the window's last
    # report's) and the 10 s restart's arrivals drained in 100 s reach every operator: about 3,490 rec/s.
    # Source 3490/1000 -> 4; flatmap 3490/500 -> 7; count 3490*5/2000 = 8.7 -> 9.
    backlog = decision.reason.numbers["backlog"]
    assert backlog is not None and 18_000 <= backlog <= 20_000
    assert decision.reason.numbers["count.target_rate"] == pytest.approx(5 * (3000 + (backlog + 3000 * 10) / 100))
    assert decision.operator_targets == {"source": 4, "flatmap": 7, "count": 9}
    assert decision.action.value == "scale_up"
    assert decision.to_parallelism == 9
    assert decision.reason.numbers["flatmap.true_processing_rate"] == pytest.approx(500.0)
    assert len(got) == 1


def test_bad_input_is_dead_lettered_with_a_reason_and_the_agents_keep_running(
    settings: Settings, agents: AgentWorker
) -> None:
    job = "dlq-job"
    register(settings, job)
    start = math.floor(time.time() / 10) * 10 - 100
    good = MetricReport(job_id=job, timestamp=start + 1, interval_s=1.0, parallelism=2, records_in=100,
                        records_out=100, busy_time_s=0.5)
    as_dict = json.loads(good.to_bytes())
    bad: list[tuple[bytes | None, bytes, str]] = [
        (b"dlq-job", b"{not json", "malformed_json"),
        (b"dlq-job", json.dumps(as_dict | {"records_in": "many"}).encode(), "invalid_report"),
        (b"dlq-job", json.dumps(as_dict | {"records_in": -5}).encode(), "invalid_report"),
        (b"dlq-job", json.dumps(as_dict | {"schema_version": 99}).encode(), "unknown_schema_version"),
        (b"dlq-job", json.dumps(as_dict | {"worker_id": "x" * 100} | {"pad": "y" * 70_000}).encode(), "oversize"),
        (b"nobody", json.dumps(as_dict | {"job_id": "nobody"}).encode(), "unknown_job"),
    ]
    letters = Collector(settings, settings.topics.dead_letter)
    send(settings, settings.topics.metrics, [(k, v) for k, v, _ in bad])
    got = letters.until(DeadLetter.model_validate_json, lambda d: len(d) >= len(bad), timeout=60)
    letters.close()
    reasons = sorted(letter.reason for letter in got)
    assert reasons == sorted(reason for _, _, reason in bad)
    for letter in got:
        assert letter.detail
    oversize = next(letter for letter in got if letter.reason == "oversize")
    assert not oversize.payload_truncated and oversize.payload_bytes > settings.max_message_bytes

    # Still alive: a good window after the bad input produces a decision.
    decisions = Collector(settings, settings.topics.decisions)
    follow = [good.model_copy(update={"timestamp": start + i}) for i in range(1, 12)]
    send(settings, settings.topics.metrics, [(job.encode(), r.to_bytes()) for r in follow])
    decisions.until(ScalingDecision.model_validate_json, lambda d: len(d) >= 1, timeout=60)
    decisions.close()
    assert agents.process.poll() is None

    rejected: dict[str, float] = {}
    for labels, value in prometheus_samples(agents.web_port, "autoscaler_reports_rejected_total"):
        reason = labels.split('reason="')[1].split('"')[0]
        rejected[reason] = rejected.get(reason, 0) + value
    assert rejected == {"malformed_json": 1, "invalid_report": 2, "unknown_schema_version": 1, "oversize": 1,
                        "unknown_job": 1}


def test_each_stage_in_its_own_process_with_two_monitor_workers(settings: Settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from functools import partial

    from stack.processes import free_port
    from stack.services import start_agents, start_together

    # Together: each returns once ready (its partitions assigned), and their group joins overlap.
    workers = start_together([partial(start_agents, settings, tmp_path / f"{stage}-{i}.log", [stage],
                                      web_port=free_port())
                              for i, stage in enumerate(("monitor", "monitor", "analyze", "plan", "execute"))])
    try:
        jobs = [f"job-{i}" for i in range(8)]
        for job in jobs:
            register(settings, job, policy="reactive", per_operator="true", target_utilization="1.0",
                     utilization_band="0", max_parallelism="64", catch_up_duration_s="100", restart_time_s="10",
                     stabilization_windows="0", min_samples="1")
        start = math.floor(time.time() / 10) * 10 - 100
        decisions = Collector(settings, settings.topics.decisions)
        records = [(job.encode(), r.to_bytes()) for job in jobs for r in three_operator_reports(job, start, 11)]
        send(settings, settings.topics.metrics, records)
        got = decisions.until(ScalingDecision.model_validate_json, lambda d: len(d) >= len(jobs), timeout=90)
        decisions.close()
        assert sorted(d.job_id for d in got) == jobs
        assert all(d.operator_targets == {"source": 4, "flatmap": 7, "count": 9} for d in got)
        # Both monitor workers took part: the jobs' partitions were shared between them.
        accepted = [accepted_reports(w.web_port) for w in workers[:2]]
        assert all(n > 0 for n in accepted) and sum(accepted) == len(records), accepted
        assert all(w.process.poll() is None for w in workers)
    finally:
        for worker in workers:
            worker.stop()

"""The proactive path against a real broker and Redis: what analyze learns survives its worker, and
the daedalus policy decides from forecasts; analyze times a recovery, which is no `recovered` event
when the autoscaler did not make the rescale."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from analyze.forecast import ForecastState
from contracts.analyses import Analysis
from contracts.decisions import EventType, ScalingDecision, ScalingEvent
from contracts.messages import MetricReport, MetricWindow, SourceMetrics, SourceWindow, WorkerWindow
from contracts.settings import Settings
from knowledge import RedisKnowledge
from stack.services import start_agents
from tests.conftest import wait_until
from tests.integration.kafka_helpers import Collector, send
from tests.integration.test_agents import register

pytestmark = pytest.mark.integration

STEP = 10.0
T0 = math.floor((1_700_000_000.0) / STEP) * STEP


def arrival(i: int) -> float:
    return 300.0 + 100.0 * math.sin(2 * math.pi * i / 30)


def window(job: str, i: int) -> MetricWindow:
    rate = arrival(i)
    utilization = 0.3 + (rate - 200.0) / 500.0  # linear: 550 rec/s when fully busy
    return MetricWindow(
        job_id=job, window_start=T0 + STEP * i, window_end=T0 + STEP * (i + 1), observed_s=STEP, report_count=1,
        workers=1, parallelism=2, parallelism_changed=False, records_in=round(rate * STEP),
        records_out=round(rate * STEP), busy_time_s=utilization * STEP * 2,
        source=SourceWindow(arrival_rate=rate, backlog=50, backlog_growth_rate=0.0, partitions=8, splittable=True),
        worker_loads=[WorkerWindow(worker_id="driver", throughput=rate, utilization=utilization,
                                   utilization_source="busy")],
    )


def snapshot(settings: Settings, job: str) -> tuple[dict[str, Any], ForecastState, bool]:
    async def read() -> tuple[dict[str, Any], ForecastState, bool]:
        knowledge = RedisKnowledge(settings)
        try:
            learned = await knowledge.learned(job)
            state_json, model = await knowledge.forecast(job)
        finally:
            await knowledge.close()
        assert learned is not None and state_json is not None
        return learned, ForecastState.model_validate_json(state_json), model is not None

    return asyncio.run(read())


def test_a_new_analyze_worker_continues_the_models_from_knowledge(settings: Settings, tmp_path: Path) -> None:
    job = "steady"
    register(settings, job, policy="hybrid", forecast_min_points="10")
    analyses = Collector(settings, settings.topics.analyses)
    worker = start_agents(settings, tmp_path / "analyze-1.log", stages=["analyze"])
    first = 30
    try:
        send(settings, settings.topics.windows, [(job.encode(), window(job, i).to_bytes()) for i in range(first)])
        analyses.until(Analysis.model_validate_json, lambda xs: len(xs) >= first, timeout=120)
        # The first ARIMA fit (requested at 10 points, run in the process pool) is installed.
        def fitted() -> bool:
            analyses.poll(0.2)  # keep the test's consumer in its group
            return snapshot(settings, job)[1].models_installed >= 1

        wait_until(fitted, timeout=120, message="first fit")
        before_learned, before_forecast, has_model = snapshot(settings, job)
        assert has_model
    finally:
        os.killpg(worker.process.pid, signal.SIGKILL)  # no graceful shutdown: a crash
        worker.process.wait(10)
    assert before_learned["windows"] == first
    assert before_learned["detector"]["normal"]["count"] == first
    assert len(before_forecast.history) == first

    worker = start_agents(settings, tmp_path / "analyze-2.log", stages=["analyze"])
    more = 10
    try:
        send(settings, settings.topics.windows,
             [(job.encode(), window(job, i).to_bytes()) for i in range(first, first + more)])
        late = analyses.until(Analysis.model_validate_json,
                              lambda xs: any(a.window_end == T0 + STEP * (first + more) for a in xs), timeout=120)
        after_learned, after_forecast, _ = snapshot(settings, job)
    finally:
        worker.stop()
        analyses.close()
    assert {a.window_end for a in late} == {T0 + STEP * (i + 1) for i in range(first + more)}
    # Continued, not restarted: counts went on from where the killed worker left them, and each
    # window was learned once, whatever the crash made the broker redeliver.
    assert after_learned["windows"] == first + more
    assert after_learned["detector"]["normal"]["count"] == first + more
    samples = sum(w["count"] for w in after_learned["capacity"]["workers"].values())
    assert samples == first + more - 1  # the job's first window is never a capacity sample
    assert after_learned["capacity"]["observed"]["2"] == pytest.approx(550.0, rel=0.01)
    assert len(after_forecast.history) == first + more
    # The model came from knowledge: the new worker forecast with ARIMA from its first window on.
    assert after_forecast.models_installed >= before_forecast.models_installed
    resumed = sorted({a.window_end: a for a in late if a.window_end > T0 + STEP * first}.values(),
                     key=lambda a: a.window_end)
    assert resumed[0].forecast is not None and resumed[0].forecast.method == "arima", resumed[0].forecast


def reports(job: str, i: int, parallelism: int, rate: float, throughput: float, backlog: int) -> MetricReport:
    utilization = min(1.0, throughput / (parallelism * 250.0))
    return MetricReport(
        job_id=job, timestamp=T0 + STEP * i + 5, interval_s=STEP, parallelism=parallelism,
        records_in=round(throughput * STEP), records_out=round(throughput * STEP),
        busy_time_s=utilization * STEP * parallelism,
        source=SourceMetrics(arrival_rate=rate, backlog=backlog, partitions=8),
    )


def test_daedalus_decides_from_the_forecast_and_a_rescale_it_did_not_make_gets_no_recovered_event(
    settings: Settings, tmp_path: Path
) -> None:
    job = "rising"
    # Recommend mode: decisions are published, nothing is executed (no job runner here).
    register(settings, job, policy="daedalus", mode="recommend", forecast_min_points="10", min_samples="1",
             stabilization_windows="0", max_parallelism="16", checkpoint_interval_s="0")
    decisions = Collector(settings, settings.topics.decisions)
    events = Collector(settings, settings.topics.scaling_events)
    analyses = Collector(settings, settings.topics.analyses)
    worker = start_agents(settings, tmp_path / "agents.log")
    try:
        stream: list[MetricReport] = []
        for i in range(20):  # steady at 2 slots, 300 rec/s
            stream.append(reports(job, i, 2, 300.0 + (5 if i % 2 else -5), 300.0, 40))
        for i in range(20, 26):  # rising: the forecast sees the trend
            stream.append(reports(job, i, 2, 300.0 + 40 * (i - 19), 300.0 + 40 * (i - 19), 40))
        # Rescaled to 4 by other means (no reports while down), then catching up, then normal.
        for i, (throughput, backlog) in enumerate([(900, 20_000), (900, 12_000), (900, 4_000), (540, 40),
                                                   (540, 45), (540, 40), (540, 42)], start=29):
            stream.append(reports(job, i, 4, 540.0, throughput, backlog))
        stream.append(reports(job, 40, 4, 540.0, 540.0, 40))  # closes the last window
        send(settings, settings.topics.metrics, [(job.encode(), r.to_bytes()) for r in stream])
        timed = analyses.until(Analysis.model_validate_json, lambda xs: any(a.recovery for a in xs), timeout=180)
        seen = next(a for a in timed if a.recovery is not None)
        # The decision of the window that saw the recovery, and execute's events for it.
        decisions.until(ScalingDecision.model_validate_json,
                        lambda xs: any(d.window_end == seen.window_end for d in xs), timeout=60)
        events.poll(3)
    finally:
        worker.stop()
        decisions.close()
        events.close()
        analyses.close()
    made = [ScalingDecision.model_validate_json(v) for _, v, _ in decisions.records]
    made = [d for d in made if d.job_id == job]
    by_policy = [d for d in made if d.reason.rule == "daedalus"]
    assert by_policy, [d.reason.message for d in made]
    rising = [d for d in by_policy if T0 + STEP * 20 < d.window_end <= T0 + STEP * 26]
    assert any(d.action.value == "scale_up" for d in rising), [(d.window_end, d.reason.message) for d in made]
    recovery = seen.recovery
    assert recovery is not None and (recovery.from_parallelism, recovery.to_parallelism) == (2, 4)
    # Stopped after the window ending at i = 26. The backlog came within 10 s of arrivals (5,400) between
    # the windows ending at i = 31 (12,000) and i = 32 (4,000): 6,600 of their 8,000 records' fall in.
    assert recovery.observed_s == pytest.approx(STEP * (31 + 6_600 / 8_000 - 26))
    # Recommend mode: nothing was executed, so the job's return to normal is no recovery from a rescale
    # of the autoscaler's.
    published = [ScalingEvent.model_validate_json(v) for _, v, _ in events.records]
    assert [e for e in published if e.type is EventType.RECOVERED] == []

"""Analyze: DS2 true processing and output rates of each closed window, kept as history in knowledge."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from agent import metrics
from agent.app import Runtime
from agent.contracts import MetricWindow
from agent.resilience import until_done
from analyze.true_rates import analyze_window
from monitor.validation import Rejection, dead_letter

log = logging.getLogger("autoscaler.analyze")


def register(runtime: Runtime) -> None:
    knowledge = runtime.knowledge
    source = runtime.topic("windows")
    runtime.topic("analyses")

    async def process(value: bytes) -> None:
        try:
            window = MetricWindow.model_validate_json(value)
        except ValidationError as exc:
            letter = dead_letter(source.get_topic_name(), value, None, Rejection("invalid_window", str(exc)), "analyze")
            await runtime.publish("dead_letter", "", letter.to_bytes())
            return
        fallback = await knowledge.last_valid_analysis(window.job_id) if window.records_in == 0 else None
        analysis = analyze_window(window, fallback)
        recorded = await knowledge.record_analysis(
            window.job_id, analysis.model_dump_json(), window.window_end, analysis.parallelism
        )
        if not recorded:
            log.info("window %s of %s already analyzed; dropped the duplicate", window.window_end, window.job_id)
            return
        await runtime.publish("analyses", analysis.job_id, analysis.to_bytes())
        if analysis.valid:
            metrics.TRUE_RATE.labels(analysis.job_id).set(analysis.true_processing_rate)
            metrics.TRUE_OUTPUT_RATE.labels(analysis.job_id).set(analysis.true_output_rate)
        if analysis.arrival_rate is not None:
            metrics.ARRIVAL_RATE.labels(analysis.job_id).set(analysis.arrival_rate)
        metrics.UTILIZATION.labels(analysis.job_id).set(analysis.utilization)
        metrics.PARALLELISM.labels(analysis.job_id).set(analysis.parallelism)
        if analysis.backlog is not None:
            metrics.BACKLOG.labels(analysis.job_id).set(analysis.backlog)

    @runtime.app.agent(source, name="analyze")
    async def analyze(stream: Any) -> None:
        async for value in stream:
            await until_done(lambda value=value: process(value), "analyze")

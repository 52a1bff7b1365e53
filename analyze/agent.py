"""Analyze: per closed window, DS2's true rates, the capacity model, the recovery detector and (for
the proactive policies) the arrival-rate forecast; all kept in knowledge, published as one analysis."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from analyze import kernel
from analyze.forecast_pool import Forecasting
from analyze.learning import forecast_view
from contracts import metrics
from contracts.dead_letters import Rejection, dead_letter
from contracts.messages import MetricWindow
from contracts.settings import Settings
from contracts.stage import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, Incoming, Publish, Subscription, Timer, per_key
from knowledge.protocols import AnalyzeKnowledge

log = logging.getLogger("autoscaler.analyze")


class AnalyzeAgent:
    """Reads `windows`; publishes `analyses` (and `dead_letter` for a window it cannot read)."""

    name = "analyze"
    publishes = ("analyses", "dead_letter")

    def __init__(self, settings: Settings, knowledge: AnalyzeKnowledge, publish: Publish):
        self.settings = settings
        self.knowledge = knowledge
        self.publish = publish
        self.forecasting = Forecasting(knowledge)

    def subscriptions(self) -> list[Subscription]:
        return [Subscription("analyze", "windows", self.process, JOB_BATCH_MAX, JOB_BATCH_WITHIN_S)]

    def timers(self) -> list[Timer]:
        return []

    async def partitions_revoked(self) -> None:
        return None

    def close(self) -> None:
        self.forecasting.close()

    async def process(self, records: list[Incoming]) -> None:
        await per_key(records, lambda record: self.analyze(record.value or b""))

    async def analyze(self, value: bytes) -> None:
        knowledge, forecasting = self.knowledge, self.forecasting
        try:
            window = MetricWindow.model_validate_json(value)
        except ValidationError as exc:
            rejection = Rejection("invalid_window", str(exc))
            letter = dead_letter(self.settings.topics.windows, value, None, rejection, "analyze")
            await self.publish("dead_letter", "", letter.to_bytes())
            return
        job = window.job_id
        async with forecasting.lock(job):  # from the reads to the commit (a refit installs under it too)
            reads = await knowledge.analyze_reads(job, window.window_end, fallback=kernel.needs_fallback(window))
            if reads.done:
                # A redelivery: publish again what was committed (plan drops it if it already has it).
                committed = await knowledge.committed_message(job, "analyze", window.window_end)
                if committed is not None:
                    await self.publish("analyses", job, committed.encode())
                log.info("window %s of %s already analyzed; dropped the duplicate", window.window_end, job)
                return
            config = reads.config
            learned = kernel.load_learned(reads.learned, config)
            # Plan's record of whether the job's policy plans with a forecast (docs/architecture.md).
            needs_forecast = reads.needs_forecast if window.source is not None else None
            settings = kernel.forecast_settings(window, config, needs_forecast)
            forecast = stepped = stored = None
            if settings is not None and window.source is not None:
                # The forecast skips points it already has, so a redelivered window does not count twice.
                stepped, stored = await forecasting.advance(job, reads.forecast, window.source.arrival_rate,
                                                            window.window_end, settings)
                forecast = forecast_view(stepped)
            analyzed = kernel.analyze(window, config, learned, reads.fallback, forecast)
            analysis, recovery = analyzed.analysis, analyzed.analysis.recovery
            message = analyzed.message()
            if not await knowledge.commit_window(job, kernel.STAGE, window.window_end, message,
                                                 values=analyzed.values(), forecast=stored):
                return  # another worker committed this window meanwhile and publishes it
        if stepped is not None and settings is not None:
            forecasting.started(job, stepped, settings)
        if recovery is not None:
            log.info("%s: recovered %.0f s after the rescale %d -> %d (%s)", job, recovery.observed_s,
                     recovery.from_parallelism, recovery.to_parallelism, recovery.judge)
        await self.publish("analyses", job, message.encode())
        if analysis.valid:
            metrics.TRUE_RATE.labels(analysis.job_id).set(analysis.true_processing_rate)
            metrics.TRUE_OUTPUT_RATE.labels(analysis.job_id).set(analysis.true_output_rate)
        if analysis.arrival_rate is not None:
            metrics.ARRIVAL_RATE.labels(analysis.job_id).set(analysis.arrival_rate)
        metrics.UTILIZATION.labels(analysis.job_id).set(analysis.utilization)
        metrics.PARALLELISM.labels(analysis.job_id).set(analysis.parallelism)
        if analysis.backlog is not None:
            metrics.BACKLOG.labels(analysis.job_id).set(analysis.backlog)

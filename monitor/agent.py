"""Monitor: validate metric reports, dead-letter bad ones, close a window per job per loop interval.

Open windows live in knowledge with the last offset applied per partition, so a restarted or
rebalanced worker continues them and skips records it already folded in.
"""

from __future__ import annotations

import logging
import time

from contracts import metrics
from contracts.settings import Settings
from contracts.stage import Incoming, Publish, Subscription, Timer, publish_per_key
from knowledge.protocols import MonitorKnowledge
from monitor import kernel
from monitor.windows import WindowState

log = logging.getLogger("autoscaler.monitor")

BATCH_MAX = 2000
BATCH_WITHIN_S = 0.01
REGISTRY_TTL_S = 2.0


class RegistryCache:
    """Known job ids and the jobs whose cluster was removed, refreshed every few seconds; a miss is re-checked
    so new jobs count at once."""

    def __init__(self, knowledge: MonitorKnowledge):
        self.knowledge = knowledge
        self.known: set[str] = set()
        self.orphaned: dict[str, str] = {}
        self.loaded_at = 0.0

    async def unknown(self, job_ids: set[str]) -> set[str]:
        now = time.monotonic()
        if now - self.loaded_at > REGISTRY_TTL_S or not job_ids <= self.known:
            self.known = await self.knowledge.jobs()
            self.orphaned = await self.knowledge.orphaned_jobs()
            self.loaded_at = now
        return job_ids - self.known


class MonitorAgent:
    """Reads `metrics`; publishes `windows` and `dead_letter`."""

    name = "monitor"
    publishes = ("windows", "dead_letter")

    def __init__(self, settings: Settings, knowledge: MonitorKnowledge, publish: Publish):
        self.settings = settings
        self.knowledge = knowledge
        self.publish = publish
        self.windows: dict[str, WindowState] = {}
        self.registry = RegistryCache(knowledge)

    def subscriptions(self) -> list[Subscription]:
        return [Subscription("monitor", "metrics", self.process, BATCH_MAX, BATCH_WITHIN_S)]

    def timers(self) -> list[Timer]:
        return []

    async def partitions_revoked(self) -> None:
        # Another worker may own these jobs now: re-read their windows from knowledge next time.
        self.windows.clear()

    def close(self) -> None:
        return None

    async def process(self, records: list[Incoming]) -> None:
        """The shell around `monitor.kernel`: read the registry and the open windows, fold, then
        publish and save in the order the kernel's `Folded` states."""
        settings, knowledge, windows, registry = self.settings, self.knowledge, self.windows, self.registry
        topic = settings.topics.metrics
        parsed = kernel.parse(records, topic, settings.max_message_bytes, time.time(), settings.max_clock_skew_s)
        unknown = await registry.unknown(parsed.job_ids())
        windows.update(await knowledge.load_windows(kernel.missing_windows(parsed, windows, unknown)))
        folded = kernel.fold(windows, parsed, unknown, settings.loop_interval_s, topic, registry.orphaned,
                             spread=settings.window_spread)
        windows.update(folded.changed)

        await publish_per_key(self.publish, "windows", [(w.job_id, w.to_bytes()) for w in folded.closed])
        for window in folded.closed:
            metrics.WINDOWS_CLOSED.labels(window.job_id).inc()
        for letter in folded.rejected:
            await self.publish("dead_letter", letter.key or "", letter.to_bytes())
            # Only registered jobs get their own series: bad input must not grow the label set.
            job_label = letter.key if letter.key in registry.known else "(unregistered)"
            metrics.REPORTS_REJECTED.labels(job_label, letter.reason).inc()
            log.warning("dead-lettered a metric report: %s: %s", letter.reason, letter.detail[:200])
        await knowledge.save_windows(folded.changed)
        await knowledge.incr_counters(folded.counters())
        for job, n in folded.accepted.items():
            metrics.REPORTS_ACCEPTED.labels(job).inc(n)

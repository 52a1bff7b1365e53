"""Monitor: validate metric reports, dead-letter bad ones, close a window per job per loop interval.

Open windows live in knowledge with the last offset applied per partition, so a restarted or
rebalanced worker continues them and skips records it already folded in.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from contracts import metrics
from contracts.dead_letters import DeadLetter, Rejection, dead_letter
from contracts.messages import MetricReport, MetricWindow
from contracts.settings import Settings
from contracts.stage import Incoming, Publish, Subscription, Timer, publish_per_key
from knowledge import Knowledge
from monitor.validation import parse_report
from monitor.windows import RefusedReport, WindowState, add_report, already_applied

log = logging.getLogger("autoscaler.monitor")

BATCH_MAX = 2000
BATCH_WITHIN_S = 0.01
REGISTRY_TTL_S = 2.0


class RegistryCache:
    """Known job ids, refreshed every few seconds; a miss is re-checked so new jobs count at once."""

    def __init__(self, knowledge: Knowledge):
        self.knowledge = knowledge
        self.known: set[str] = set()
        self.loaded_at = 0.0

    async def unknown(self, job_ids: set[str]) -> set[str]:
        now = time.monotonic()
        if now - self.loaded_at > REGISTRY_TTL_S or not job_ids <= self.known:
            self.known = await self.knowledge.jobs()
            self.loaded_at = now
        return job_ids - self.known


class MonitorAgent:
    """Reads `metrics`; publishes `windows` and `dead_letter`."""

    name = "monitor"
    publishes = ("windows", "dead_letter")

    def __init__(self, settings: Settings, knowledge: Knowledge, publish: Publish):
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
        settings, knowledge, windows, registry = self.settings, self.knowledge, self.windows, self.registry
        topic = settings.topics.metrics
        now = time.time()
        rejected: list[DeadLetter] = []
        accepted: list[tuple[MetricReport, Incoming]] = []
        for record in records:
            result = parse_report(record.value, record.key, settings.max_message_bytes, now, settings.max_clock_skew_s)
            if isinstance(result, Rejection):
                rejected.append(_dead(topic, record, result))
            else:
                accepted.append((result, record))

        unknown = await registry.unknown({report.job_id for report, _ in accepted})
        missing = {r.job_id for r, _ in accepted if r.job_id not in windows and r.job_id not in unknown}
        windows.update(await knowledge.load_windows(missing))

        closed: list[MetricWindow] = []
        dirty: set[str] = set()
        accepted_per_job: Counter[str] = Counter()
        redelivered = 0
        for report, record in accepted:
            job = report.job_id
            partition, offset = record.partition, record.offset
            if job in unknown:
                rejected.append(_dead(topic, record, Rejection(
                    "unknown_job", f"job {job!r} is not registered (autoscaler jobs register {job})")))
                continue
            state = windows.get(job)
            if already_applied(state, partition, offset, report):
                redelivered += 1  # after a restart or rebalance: already in the window, counted once
                continue
            try:
                state, window = add_report(state, report, settings.loop_interval_s, partition, offset)
            except RefusedReport as exc:  # late_report, duplicate_report
                rejected.append(_dead(topic, record, Rejection(exc.reason, str(exc))))
                continue
            windows[job] = state
            dirty.add(job)
            accepted_per_job[job] += 1
            if window is not None:
                closed.append(window)

        # Windows first (acknowledged by the broker), state second: a crash in between re-closes a
        # window (analyze and plan drop the duplicate by its end) instead of losing it.
        await publish_per_key(self.publish, "windows", [(window.job_id, window.to_bytes()) for window in closed])
        for window in closed:
            metrics.WINDOWS_CLOSED.labels(window.job_id).inc()
        for letter in rejected:
            await self.publish("dead_letter", letter.key or "", letter.to_bytes())
            # Only registered jobs get their own series: bad input must not grow the label set.
            job_label = letter.key if letter.key in registry.known else "(unregistered)"
            metrics.REPORTS_REJECTED.labels(job_label, letter.reason).inc()
            log.warning("dead-lettered a metric report: %s: %s", letter.reason, letter.detail[:200])
        await knowledge.save_windows({job: windows[job] for job in dirty})
        counts = {"reports_accepted": sum(accepted_per_job.values()), "reports_redelivered": redelivered}
        counts.update(Counter(f"rejected:{letter.reason}" for letter in rejected))
        await knowledge.incr_counters({k: v for k, v in counts.items() if v})
        for job, n in accepted_per_job.items():
            metrics.REPORTS_ACCEPTED.labels(job).inc(n)


def _dead(topic: str, record: Incoming, rejection: Rejection) -> DeadLetter:
    return dead_letter(topic, record.value, record.key, rejection, "monitor", record.partition, record.offset)

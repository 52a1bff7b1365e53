"""Publishes MetricReports for any PySpark streaming query (topic `autoscaler.metrics`, key = job id).

    reporter = attach_reporter(spark, query, job_id="orders", parallelism=4)
    ...
    reporter.close()

A StreamingQueryListener turns progress events into one report per `min_interval_s`:
  records_in    the records the interval's batches read: per batch the smaller of numInputRows and the
                source's offsets apart (`pipeline.metrics.rows_read`: a self-join counts each record
                twice in numInputRows);
  records_out   the job's own count (`OutputCounter`) if it keeps one, else the sink's row count
                when the sink reports it, else records_in;
  busy_time_s   executorRunTime summed over the stages that completed in the interval, read from
                the driver's REST API (/api/v1/applications/<app>/stages); only completed stages
                count, so one query per application keeps the numbers the query's own;
  cpu_utilization  executorCpuTime / (interval x slots); JVM task threads only, so work done in
                Python workers (UDFs, the Python Kafka source) is not in it;
  source        log-end growth per second (arrival rate), log end minus processed end plus what
                arrived while the last batch ran (backlog), and the partition count, from the
                source's offsets in the progress;
  state         per stateful operator (the progress's stateOperators) its rows and memory at the
                interval's end, its commit time over the interval and its state partitions;
  watermark_lag_s  the interval's end minus the query's event-time watermark;
  output_lag_s  the interval's end minus the newest event time the job wrote (`OutputCounter.add`'s
                `newest_event_time`), when the job gives it.
Reporting runs on its own thread and never raises into Spark: a failure is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from pyspark.sql.streaming import StreamingQueryListener

from contracts.messages import MetricReport
from contracts.settings import get_settings
from infra.security import kafka_security_config
from pipeline.metrics import IntervalAggregator, ProgressSample, StageTotals, StageTracker, sample_from_progress

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

_CLOSE = object()


@dataclass(frozen=True)
class _Idle:
    query_id: str


class OutputCounter:
    """Records the job's sink wrote; the job adds, the reporter takes the sum per interval.

    A job that knows the event times of what it wrote passes the newest with each add; the reporter
    reports the output's event-time lag from the newest of all (`newest_event_time`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._used = False
        self._newest: float | None = None

    def add(self, records: int, newest_event_time: float | None = None) -> None:
        """Count `records` written; `newest_event_time` (epoch s): the newest event time among them."""
        with self._lock:
            self._count += records
            self._used = True
            if newest_event_time is not None and math.isfinite(newest_event_time) and (
                    self._newest is None or newest_event_time > self._newest):
                self._newest = float(newest_event_time)

    def newest_event_time(self) -> float | None:
        """The newest event time the job's sink wrote so far; None until the job gave one."""
        with self._lock:
            return self._newest

    def take(self) -> int | None:
        """The count since the last take, or None if the job never counted."""
        with self._lock:
            if not self._used:
                return None
            count, self._count = self._count, 0
            return count


class SparkStages:
    """Reads the stage list from the driver's REST API."""

    def __init__(self, spark: SparkSession, timeout: float = 5.0):
        sc = spark.sparkContext
        self.app_id = sc.applicationId
        self.timeout = timeout
        self.base = _local_url(sc.uiWebUrl) if sc.uiWebUrl else None

    def list(self) -> list[dict[str, Any]]:
        if self.base is None:
            raise RuntimeError("the Spark UI is disabled (spark.ui.enabled=false): no stage metrics")
        url = f"{self.base}/api/v1/applications/{self.app_id}/stages?status=complete"
        with urllib.request.urlopen(url, timeout=self.timeout) as response:
            data = json.load(response)
        return data if isinstance(data, list) else []


def _local_url(url: str) -> str:
    # The UI advertises the machine's host name; the driver runs here, so loopback always works.
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"127.0.0.1:{parts.port}", "", "", "")) if parts.port else url


class MetricsReporter(StreamingQueryListener):
    def __init__(
        self,
        spark: SparkSession,
        *,
        job_id: str,
        parallelism: int,
        bootstrap: str,
        topic: str,
        query_id: str | None = None,
        query_name: str | None = None,
        min_interval_s: float = 5.0,
        output_counter: OutputCounter | None = None,
        splittable: bool = True,
        on_report: Callable[[MetricReport], None] | None = None,
        security: Mapping[str, str] | None = None,
        shuffle_partitions: int | None = None,
    ):
        super().__init__()
        from confluent_kafka import Producer

        self.spark = spark
        self.job_id = job_id
        self.parallelism = parallelism
        self.topic = topic
        self.query_id = query_id
        self.query_name = query_name
        self.min_interval_s = min_interval_s
        self.output_counter = output_counter
        self.on_report = on_report
        self.published = 0
        self.failures = 0
        self._aggregator = IntervalAggregator(job_id=job_id, started_at=time.time(), splittable=splittable,
                                              shuffle_partitions=shuffle_partitions)
        self._stages = SparkStages(spark)
        self._tracker = StageTracker()
        self._producer: Producer = Producer(
            {"bootstrap.servers": bootstrap, **(security or {}), "linger.ms": 5, "acks": "all"}
        )
        self._queue: queue.Queue[object] = queue.Queue(maxsize=10_000)
        try:
            self._tracker.prime(self._stages.list())
        except Exception as exc:
            log.warning("metrics reporter: cannot read the stage list yet: %s", exc)
        self._thread = threading.Thread(target=self._run, name=f"metrics-reporter-{job_id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ listener callbacks (Spark's thread)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            progress = event.progress
            if not self._matches(str(progress.id), progress.name):
                return
            self._queue.put_nowait(sample_from_progress(progress))
        except Exception:
            log.exception("metrics reporter: cannot read a progress event")

    def onQueryIdle(self, event: Any) -> None:
        # After the first idle progress event Spark posts only idle events, yet it still refreshes
        # lastProgress (with the source's log end), which keeps arrival rate and backlog current.
        try:
            if self.query_id is not None and str(event.id) == self.query_id:
                self._queue.put_nowait(_Idle(self.query_id))
        except Exception:
            log.exception("metrics reporter: cannot read an idle event")

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def _matches(self, query_id: str, name: str | None) -> bool:
        if self.query_id is not None:
            return query_id == self.query_id
        if self.query_name is None or name == self.query_name:
            self.query_id = query_id  # idle events carry only the id
            return True
        return False

    # ------------------------------------------------------------ reporting thread

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                self._publish_due(force=True)
                return
            if isinstance(item, _Idle):
                item = self._idle_sample(item.query_id)
                if item is None:
                    continue
            assert isinstance(item, ProgressSample)
            self._aggregator.add(item)
            self._publish_due(force=False)

    def _idle_sample(self, query_id: str) -> ProgressSample | None:
        try:
            query = self.spark.streams.get(query_id)
            progress = query.lastProgress if query is not None else None
            if progress is None:
                return None
            sample = sample_from_progress(progress)
        except Exception as exc:
            log.debug("metrics reporter: no progress for an idle event: %s", exc)
            return None
        last = self._aggregator.last_sample
        if last is not None and sample.trigger_start <= last.trigger_start:
            return None
        return sample

    def _publish_due(self, force: bool) -> None:
        if force:
            if self._aggregator.pending_samples == 0:
                return
        elif not self._aggregator.due(time.time(), self.min_interval_s):
            return
        try:
            newest = self.output_counter.newest_event_time() if self.output_counter is not None else None
            report = self._aggregator.report(self.parallelism, self._stage_totals(), self._job_output(), newest)
            if report is None:
                return
            self._producer.produce(self.topic, key=self.job_id.encode(), value=report.to_bytes())
            self._producer.poll(0)
            self.published += 1
            if self.on_report is not None:
                self.on_report(report)
        except Exception:
            self.failures += 1
            log.exception("metrics reporter: cannot publish a report for %s", self.job_id)

    def _stage_totals(self) -> StageTotals:
        try:
            return self._tracker.new_completed(self._stages.list())
        except (OSError, urllib.error.URLError, ValueError, RuntimeError) as exc:
            log.warning("metrics reporter: no stage metrics this interval: %s", exc)
            return StageTotals(available=False)

    def _job_output(self) -> int | None:
        return self.output_counter.take() if self.output_counter is not None else None

    # ------------------------------------------------------------ lifecycle

    def close(self, timeout: float = 10.0) -> None:
        """Detach from Spark, publish what is pending and flush the producer."""
        try:
            self.spark.streams.removeListener(self)
        except Exception as exc:
            log.debug("metrics reporter: removeListener: %s", exc)
        self._queue.put(_CLOSE)
        self._thread.join(timeout)
        remaining = self._producer.flush(timeout)
        if remaining:
            log.warning("metrics reporter: %d reports not delivered", remaining)
        # Released now, not when Spark's listener bus lets go of this object: a producer left behind
        # keeps reconnecting (and logging) once the broker is gone.
        self._producer.close()


def attach_reporter(
    spark: SparkSession,
    query_or_name: StreamingQuery | str,
    job_id: str,
    parallelism: int,
    bootstrap: str | None = None,
    topic: str | None = None,
    *,
    min_interval_s: float = 5.0,
    output_counter: OutputCounter | None = None,
    splittable: bool = True,
    on_report: Callable[[MetricReport], None] | None = None,
    security: Mapping[str, str] | None = None,
    shuffle_partitions: int | None = None,
) -> MetricsReporter:
    """Attach a reporter to one query (a StreamingQuery, matched by its id, or a query name).

    `bootstrap`, `topic` and `security` (SASL/SSL client properties) default to the autoscaler
    settings (AUTOSCALER_KAFKA_BOOTSTRAP, AUTOSCALER_TOPICS__METRICS, AUTOSCALER_KAFKA_SECURITY_*).
    """
    settings = get_settings()
    if isinstance(query_or_name, str):
        query_id, query_name = None, query_or_name
    else:
        query_id, query_name = str(query_or_name.id), None
    reporter = MetricsReporter(
        spark,
        job_id=job_id,
        parallelism=parallelism,
        bootstrap=bootstrap or settings.kafka_bootstrap,
        topic=topic or settings.topics.metrics,
        query_id=query_id,
        query_name=query_name,
        min_interval_s=min_interval_s,
        output_counter=output_counter,
        splittable=splittable,
        on_report=on_report,
        security=kafka_security_config(settings) if security is None else security,
        shuffle_partitions=shuffle_partitions,
    )
    spark.streams.addListener(reporter)
    return reporter

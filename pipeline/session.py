"""Building SparkSessions for streaming jobs whose parallelism the autoscaler sets."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_conf(parallelism: int, master: str | None = None, app_name: str = "autoscaler-job") -> dict[str, str]:
    """The configuration that gives a job `parallelism` task slots.

    local[N] runs N task slots in this process. On a standalone cluster (spark://host:port) the job
    asks for N one-core executors; the runner checks that they all registered.
    """
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    master = master or f"local[{parallelism}]"
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.default.parallelism": str(parallelism),
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        # Idle progress events (and so metric reports) keep coming while no data arrives.
        "spark.sql.streaming.noDataProgressEventInterval": "5000",
    }
    if master.startswith("spark://"):
        conf.update({
            "spark.cores.max": str(parallelism),
            **executor_conf(1, 1.0),
            # The session waits (up to this long) for all executors before it schedules anything.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "30s",
        })
    return conf


def executor_conf(cores: int, memory_gb: float) -> dict[str, str]:
    """The Spark settings that give an application's executors `cores` cores and `memory_gb` GB each."""
    return {"spark.executor.cores": str(cores), "spark.executor.memory": f"{round(memory_gb * 1024)}m"}


def build_session(
    parallelism: int,
    master: str | None = None,
    app_name: str = "autoscaler-job",
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A new SparkSession with `parallelism` task slots.

    Raises if a session is already running: getOrCreate would hand it back with its old
    parallelism, so the caller must stop it first.
    """
    # Python workers (the Kafka source, pandas/arrow UDFs) must run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        raise RuntimeError("a SparkSession is already running in this process; stop it first")

    builder = SparkSession.builder
    for key, value in {**spark_conf(parallelism, master, app_name), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def task_slots(spark: SparkSession) -> int:
    """Task slots the session has now: local[N] threads or registered executor cores."""
    master = spark.sparkContext.master
    if master.startswith("local"):
        return spark.sparkContext.defaultParallelism
    tracker = spark.sparkContext._jsc.sc().statusTracker()  # type: ignore[union-attr]
    infos = tracker.getExecutorInfos()
    # The driver is listed too; it runs no tasks in cluster mode.
    executors = len(infos) - 1
    cores = int(spark.conf.get("spark.executor.cores", "1") or 1)
    return max(0, executors) * cores

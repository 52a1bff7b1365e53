"""The in-place backend: a running application's executors changed without restarting its query
(`execute.backend.ScalingBackend` of kind `in_place`), on a Spark standalone cluster.

Flink's autoscaler rescales a running job in place since Flink 1.18; Spark has no such path for
Structured Streaming (its dynamic allocation is built for batch). This backend uses Spark's
executor-allocation developer API through the JVM gateway:

- the application may hold up to `max_parallelism` one-core executors (`spark.cores.max`), with
  dynamic allocation off; the query's task count is fixed at `max_parallelism` (the source splits
  its input into that many partitions, shuffles use that many), so every executor finds work at
  the next micro-batch;
- adding executors asks the cluster manager for a new total (`requestTotalExecutors`) and waits
  until they registered; the query keeps running at the old capacity meanwhile;
- removing executors holds the query between two micro-batches (the source's pause file), kills
  the chosen executors while no task runs (no task fails; state they held is reloaded from the
  checkpoint by the next batch), then lets the query go on;
- a cluster that grants fewer executors than asked is retried and then reported as partially
  applied, with the parallelism the job really has; the rest of the request is withdrawn.

The start still launches a new session (and, at first, up to `max_parallelism` executors, then
releases the ones above the start's parallelism).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.backends import DEFAULT_DOWN_PAUSE_S, DEFAULT_RAMP_S, ActionCost, BackendKind, in_place_cost
from contracts.plan_state import Downtimes
from execute.backend import BackendOutcome, StartError
from pipeline.job import BuildFunction
from pipeline.restart import RestartFromCheckpoint, SparkJobConfig
from pipeline.source_control import clear_pause, pause_between_batches, write_share

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SHARE_FILE = "admission-share"


class NotInPlace(ValueError):
    """This job's cluster manager cannot change its executors (local mode)."""


def can_change_in_place(master: str | None) -> str | None:
    """None when `master` lets a running application change its executors; otherwise why not."""
    if master and master.startswith("spark://"):
        return None
    return (f"the master {master or 'local[N]'} runs one executor in the driver and cannot change executors "
            "in place; rescaling restarts the query from its checkpoint")


def executors_to_remove(executor_ids: Sequence[str], target: int) -> list[str]:
    """Which executors go so that `target` remain: the newest (highest id) first, so the oldest,
    whose state stores and caches are warm, stay. Pure."""
    if target < 0:
        raise ValueError(f"target must be >= 0, got {target}")
    ordered = sorted(executor_ids, key=lambda e: (len(e), e))
    return ordered[target:]


class ExecutorControl:
    """The executor-allocation developer API of a running SparkContext (a thin shell over py4j)."""

    def __init__(self, spark: SparkSession):
        self._sc = spark.sparkContext
        self._jsc: Any = self._sc._jsc.sc()  # type: ignore[union-attr]
        self._jvm: Any = self._sc._jvm

    def executor_ids(self) -> list[str]:
        seq = self._jsc.getExecutorIds()
        return [str(seq.apply(i)) for i in range(seq.size())]

    def request_total(self, total: int) -> bool:
        no_locality = self._jvm.PythonUtils.toScalaMap(self._jvm.java.util.HashMap())
        return bool(self._jsc.requestTotalExecutors(total, 0, no_locality))

    def kill(self, executor_ids: Sequence[str]) -> bool:
        ids = self._jvm.PythonUtils.toSeq(self._jvm.java.util.ArrayList(list(executor_ids)))
        return bool(self._jsc.killExecutors(ids))


class InPlaceExecutors(RestartFromCheckpoint):
    """Starts the job once, then changes its executors in place. Not thread-safe."""

    kind = BackendKind.IN_PLACE

    def __init__(self, config: SparkJobConfig, max_parallelism: int, build: BuildFunction | None = None,
                 register_timeout_s: float = 60.0):
        reason = can_change_in_place(config.master)
        if reason is not None:
            raise NotInPlace(reason)
        if max_parallelism < 1:
            raise ValueError(f"max_parallelism must be >= 1, got {max_parallelism}")
        fixed = str(max_parallelism)
        config = replace(
            config,
            options={**config.options, "minPartitions": fixed,
                     "shareFile": str(Path(config.checkpoint_dir) / SHARE_FILE)},
            spark_conf={
                "spark.sql.shuffle.partitions": fixed,
                "spark.dynamicAllocation.enabled": "false",
                "spark.decommission.enabled": "true",
                **config.spark_conf,
            },
        )
        super().__init__(config, build)
        self.max_parallelism = max_parallelism
        self.fixed_tasks = max_parallelism
        self.register_timeout_s = register_timeout_s
        self.control: ExecutorControl | None = None

    # ------------------------------------------------------------ start

    def _start_session(self, parallelism: int) -> None:
        from pipeline.session import build_session

        if parallelism > self.max_parallelism:
            raise StartError(f"parallelism {parallelism} is above the job's maximum {self.max_parallelism}")
        self.spark = build_session(self.max_parallelism, self.config.master,
                                   app_name=f"autoscaler-{self.config.job_id}", extra_conf=self.config.spark_conf)
        self.spark.sparkContext.setLogLevel("WARN")
        self.control = ExecutorControl(self.spark)
        self._share(parallelism)
        got, _ = self._set_executors(parallelism, pause=False)
        if got != parallelism:
            raise StartError(f"the cluster granted {got} of {parallelism} executors")

    def _start_query(self, parallelism: int) -> None:
        # The query is built for the most tasks it will ever run; the reports say what runs now.
        super()._start_query(self.max_parallelism)
        if self.reporter is not None:
            self.reporter.parallelism = parallelism

    def _share(self, executors: int) -> None:
        """Batches admit in proportion to the executors that run: a batch keeps its length in time."""
        write_share(self.config.options["shareFile"], executors / self.max_parallelism)

    def _teardown(self) -> None:
        super()._teardown()
        self.control = None

    # ------------------------------------------------------------ rescale

    def _set_executors(self, target: int, pause: bool) -> tuple[int, float]:
        """Ask for `target` executors; going down, hold the query between batches (`pause`) while
        the extra ones are told to go (no task is offered to them from then on). Returns how many are
        registered when the count settled or the wait ended, and how long the query was held."""
        assert self.control is not None
        held_s = 0.0
        self.control.request_total(target)
        current = self.control.executor_ids()
        if len(current) > target:
            held = pause and self.query is not None and self.pausable
            if held:
                assert self.query is not None
                if not pause_between_batches(self.query, self.config.pause_file, self.config.stop_timeout_s):
                    log.warning("no trigger acknowledged the pause; removing executors anyway")
            began = time.monotonic()
            try:
                self.control.kill(executors_to_remove(current, target))
            finally:
                if held:
                    clear_pause(self.config.pause_file)
                    held_s = time.monotonic() - began
            self._wait_count(lambda n: n <= target)
            log.info("executors %d -> %d: held %.1f s, gone after %.1f s", len(current), target, held_s,
                     time.monotonic() - began)
        else:
            self._wait_count(lambda n: n >= target)
        return len(self.control.executor_ids()), held_s

    def _wait_count(self, settled: Callable[[int], bool]) -> None:
        assert self.control is not None
        deadline = time.monotonic() + self.register_timeout_s
        while not settled(len(self.control.executor_ids())) and time.monotonic() < deadline:
            time.sleep(0.1)

    def apply(self, target: int) -> BackendOutcome:
        """Change the running application's executors to `target`, retrying a shortfall; the query
        is never restarted. Partially applied (ok False) when the cluster granted fewer."""
        previous = self._parallelism
        if previous is None or self.query is None:
            raise RuntimeError("the job is not running")
        if target > self.max_parallelism:
            return BackendOutcome(False, previous, 0, (f"parallelism {target} is above the job's maximum "
                                                      f"{self.max_parallelism}",))
        requested = time.monotonic()
        errors: list[str] = []
        got, attempts = previous, 0
        if target < previous:
            self._share(target)  # the batch after the hold already admits for the fewer executors
        held = 0.0
        for attempts in range(1, 2 + max(0, self.config.retries)):
            got, held_now = self._set_executors(target, pause=target < previous)
            held += held_now
            if got == target:
                break
            errors.append(f"attempt {attempts}: the cluster granted {got} of {target} executors")
            log.warning("job %s: %s", self.config.job_id, errors[-1])
        if got != target:
            # Withdraw the rest of the request: an executor the cluster launched later, when a core
            # frees, would run with no report saying so. The plan, told `got`, decides again.
            assert self.control is not None
            self.control.request_total(got)
        took = time.monotonic() - requested
        self._parallelism = got
        self._share(got)
        if self.reporter is not None:
            self.reporter.parallelism = got
        log.info("job %s: executors %d -> %d in place in %.1f s (held %.1f s)", self.config.job_id, previous, got,
                 took, held)
        # What the runner learns as this direction's downtime: going up, the time until the new
        # capacity is there (the job kept processing at the old one: a safe side for the planner's
        # recovery predictions); going down, the time the query was held between batches.
        return BackendOutcome(got == target, got, attempts, tuple(errors),
                              downtime_s=took if target > previous else held, ramp_s=took)

    def expected_cost(self, current: int, target: int, measured: Downtimes) -> ActionCost:
        """Adding: the measured time until executors registered, at the old capacity. Removing: the
        measured hold between batches. Nothing replayed."""
        return in_place_cost(current, target, measured, DEFAULT_RAMP_S, DEFAULT_DOWN_PAUSE_S)

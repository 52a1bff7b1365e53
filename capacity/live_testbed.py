"""The Spark job on this machine as a capacity-planning testbed (StreamBed's testbed, live).

`LiveTestbed` runs the demo job (or any registered entry point) in this process on a broker of its
own, with the project's load generator injecting a rate it changes between steps:

  warm-up       the job at one slot under a low rate for `warm_up_s` (many small micro-batches: Spark's
                fixed cost per batch falls over its first minutes in a process, see
                `evaluation.calibrate`), then a short overload, whose admitted rate is the first
                search's start: StreamBed's warm-up at a high rate;
  run(s, r)     the job at `s` slots (restarted from its checkpoint when `s` changes, then given
                RESTART_SETTLE_S more), `r` records/s injected; after `settle_s`, the step is
                measured between micro-batch starts for at least `measure_s`
                (`capacity.mst.step_from_batches`: a window that cuts batches would be off by
                up to one batch).

A step after a failed one starts with a backlog: below the MST the job drains it (admitting more than
is injected, its backlog shrinking), above it the backlog grows, so it is judged alike. Nothing of the
truth is known: `truth` is None.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from capacity.mst import MIN_BATCHES, Batch, Step, step_from_batches
from evaluation.calibrate import background_load, job_config, own_broker
from pipeline.metrics import sample_from_progress
from pipeline.restart import RestartFromCheckpoint

log = logging.getLogger(__name__)
OVERLOAD = 4.0  # the warm-up's overload, times its low rate
OVERLOAD_S = 30.0
# A restart (a new slot count) leaves a backlog and a new query whose first micro-batches can run
# slower than the following ones: the first step waits this much more.
RESTART_SETTLE_S = 15.0
# The live search: it starts 5 % under the rate the warm-up's overload admitted at one slot (later
# configurations: what was measured, extrapolated), grows by 10 % until a step fails and stops within 2 %
# (a 1 % bracket costs one more step per configuration; the MST repeats within a few % live anyway).
LIVE_START, LIVE_GROWTH, LIVE_SENSIBILITY = 0.95, 1.10, 0.02


@dataclass
class Adjustable:
    """A load shape whose rate the testbed sets between steps (read by the load generator's thread)."""

    rate_per_s: float = 0.0
    duration_s: float | None = None

    def rate(self, t: float) -> float:
        return self.rate_per_s


@dataclass
class LiveTestbed:
    options: dict[str, str]
    settle_s: float = 10.0
    measure_s: float = 20.0
    topic_partitions: int = 4
    entry_point: str = "pipeline.demo:build"
    master: str | None = None  # None: local mode in this process; or a standalone cluster's spark://host:port
    spark_conf: dict[str, str] = field(default_factory=dict)  # e.g. the executors' cores and memory
    runs: int = field(default=0, init=False)
    restarts: list[float] = field(default_factory=list, init=False)  # seconds each rescale took
    _stack: ExitStack = field(default_factory=ExitStack, init=False)
    _job: RestartFromCheckpoint | None = field(default=None, init=False)
    _load: Adjustable = field(default_factory=Adjustable, init=False)

    def __enter__(self) -> LiveTestbed:
        bootstrap = self._stack.enter_context(own_broker())
        self._stack.enter_context(background_load(bootstrap, self._load, self.topic_partitions, duration_s=7 * 86400))
        directory = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
        self._job = RestartFromCheckpoint(job_config(bootstrap, self.options, directory, entry_point=self.entry_point,
                                                     master=self.master, spark_conf=dict(self.spark_conf)))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self._job is not None and self._job.parallelism is not None:
                self._job.stop()
        finally:
            self._stack.close()

    @property
    def job(self) -> RestartFromCheckpoint:
        if self._job is None:
            raise RuntimeError("use the testbed in a with block")
        return self._job

    def _at(self, slots: int) -> bool:
        """Run the job at `slots`; whether it had to (re)start."""
        if self.job.parallelism is None:
            self.job.start(slots)
            return True
        if self.job.parallelism != slots:
            outcome = self.job.apply(slots)
            if not outcome.ok:
                raise RuntimeError(f"the rescale to {slots} slots failed: {outcome.errors}")
            self.restarts.append(outcome.downtime_s or math.nan)
            return True
        return False

    def warm_up(self, rate: float, seconds: float, overload_s: float = OVERLOAD_S, slots: int = 1) -> float:
        """Run `slots` at `rate` for `seconds`, then at OVERLOAD times it for `overload_s`: the rate the
        job admitted under overload (or the overload itself, if it kept up), where the first search starts."""
        self._at(slots)
        self._load.rate_per_s = rate
        time.sleep(seconds)
        step = self.run(slots, OVERLOAD * rate, settle_s=5.0, measure_s=overload_s)
        return step.injected if step.sustained else step.processed

    def run(self, slots: int, rate: float, settle_s: float | None = None, measure_s: float | None = None) -> Step:
        self.runs += 1
        restarted = self._at(slots)
        self._load.rate_per_s = rate
        time.sleep((self.settle_s if settle_s is None else settle_s) + (RESTART_SETTLE_S if restarted else 0.0))
        began = time.time()
        wanted = self.measure_s if measure_s is None else measure_s
        deadline = time.monotonic() + max(120.0, 6 * wanted)
        while True:
            time.sleep(1.0)
            batches = self._batches(since=began)
            long_enough = len(batches) >= MIN_BATCHES and batches[-1].start - batches[0].start >= wanted
            if long_enough or (time.monotonic() > deadline and len(batches) >= MIN_BATCHES):
                step = step_from_batches(rate, batches)
                log.info("%d slots at %.0f rec/s: admitted %.0f rec/s, backlog %+.0f over %.0f s (%s)", slots, rate,
                         step.processed, step.backlog_growth, step.measured_s,
                         "sustained" if step.sustained else "not sustained")
                return step
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {MIN_BATCHES} micro-batches in {max(120.0, 6 * wanted):.0f} s")

    def _batches(self, since: float) -> list[Batch]:
        query = self.job.query
        progress: list[Any] = list(query.recentProgress) if query is not None else []
        batches = []
        for item in progress:
            sample = sample_from_progress(item)
            if sample.trigger_start >= since and sample.processed and sample.log_end:
                batches.append(Batch(sample.trigger_start, sum(sample.processed.values()),
                                     sum(sample.log_end.values())))
        return sorted(batches, key=lambda b: b.start)

    def truth(self, slots: int) -> float | None:
        return None

"""What a Spark micro-batch costs beyond its records, learned online from the job's windows (pure).

A saturated micro-batch job does not run at its slots' rate. Two fixed costs stand between them:
- per batch (`BatchCost.overhead_s`): wall time no slot works (offsets, planning, commits, the
  driver's part), measured by `Analysis.batch_overhead_s`;
- per task (`TaskCost`): busy time each task spends whatever its size (launching it, opening its
  source reader, starting its Python worker's part). A task's busy time is `task_s + records x
  work_s`, one task per slot per batch, so DS2's true rate, records / busy time, is lower for small
  batches than for full ones: measured at a low load, a job looks slower than it will be when it must
  catch up.
Capacity is what a saturated job sustains: the records of full batches over the batches' wall time.
`saturation_factor` turns a DS2 rate measured at some batch size into the one a full batch would
show; `BatchCost.efficiency` then takes off the per-batch cost.

DS2 (Kalavri et al., OSDI 2018) measures true rates per busy second; the per-task term is this
project's extension for micro-batches (as `evaluation.jobmodel` models them), fitted by least squares.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

KNOWN_WINDOWS = 30  # the batch costs average about the last this many windows (5 min of 10-s windows)
TASK_WINDOWS = 360  # the per-task fit remembers about an hour of windows: the job's costs are its own
TASK_MIN_WINDOWS = 6
TASK_MIN_SPREAD = 0.25  # the fit needs batch sizes whose coefficient of variation is at least this
MAX_SATURATION_FACTOR = 5.0  # a bound for a fit gone wrong: a fifth of the full rate is a batch of a few records


def running_weight(n: int, windows: int) -> float:
    """A running mean's weight for the n-th point, then an exponential one's (1 / windows)."""
    return max(1 / n, 1 / windows)


class TaskCost(BaseModel):
    """Least squares of a task's busy seconds on its records, over windows (exponentially weighted
    means, variance and covariance). A window gives one point: records per task in a batch (x) and
    busy seconds per task in a batch (y)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = 0
    mean_x: float = 0.0
    mean_y: float = 0.0
    var_x: float = 0.0
    cov_xy: float = 0.0

    def add(self, records: float, busy_s: float) -> TaskCost:
        if not (records > 0 and busy_s > 0):
            return self
        n = self.n + 1
        a = running_weight(n, TASK_WINDOWS)
        dx, dy = records - self.mean_x, busy_s - self.mean_y
        return TaskCost(n=n, mean_x=self.mean_x + a * dx, mean_y=self.mean_y + a * dy,
                        var_x=(1 - a) * (self.var_x + a * dx * dx), cov_xy=(1 - a) * (self.cov_xy + a * dx * dy))

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds per task, busy seconds per record), or None until TASK_MIN_WINDOWS windows
        with batch sizes spread enough to tell the two apart. The fixed cost is kept within [0, 90 %
        of a mean task] and the line goes through the mean point."""
        if self.n < TASK_MIN_WINDOWS or self.mean_x <= 0 or self.var_x <= (TASK_MIN_SPREAD * self.mean_x) ** 2:
            return None
        slope = self.cov_xy / self.var_x
        if slope <= 0:
            return None
        fixed = min(max(0.0, self.mean_y - slope * self.mean_x), 0.9 * self.mean_y)
        return fixed, (self.mean_y - fixed) / self.mean_x


class BatchCost(BaseModel):
    """Micro-batches (Spark): the fixed wall time each costs beyond its work (`Analysis.batch_overhead_s`),
    the work a full batch holds per slot, measured while the backlog kept batches full, and the per-task
    fit (`TaskCost`). Running means, then exponentially weighted (1 / KNOWN_WINDOWS)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    overhead_s: float
    full_work_s: float | None = None
    n: int = 1
    full_n: int = 0
    tasks: TaskCost = TaskCost()

    def add(self, overhead_s: float, work_s: float | None, full: bool, records: float | None = None) -> BatchCost:
        """One window: its batch overhead, its busy seconds per slot per batch (`work_s`), whether its
        batches were full, and its records per slot per batch."""
        n = self.n + 1
        weight = running_weight(n, KNOWN_WINDOWS)
        update: dict[str, Any] = {"overhead_s": (1 - weight) * self.overhead_s + weight * overhead_s, "n": n}
        if full and work_s is not None:
            full_n = self.full_n + 1
            w = running_weight(full_n, KNOWN_WINDOWS)
            update |= {"full_n": full_n,
                       "full_work_s": work_s if self.full_work_s is None else (1 - w) * self.full_work_s + w * work_s}
        if work_s is not None and records is not None:
            update["tasks"] = self.tasks.add(records, work_s)
        return self.model_copy(update=update)

    @classmethod
    def first(cls, overhead_s: float, work_s: float | None, full: bool, records: float | None = None) -> BatchCost:
        counted = full and work_s is not None
        start = cls(overhead_s=overhead_s, full_work_s=work_s if counted else None, full_n=int(counted))
        tasks = start.tasks.add(records, work_s) if work_s is not None and records is not None else start.tasks
        return start.model_copy(update={"tasks": tasks})

    @property
    def efficiency(self) -> float:
        """The share of a saturated job's time its slots work on records: full work / (full work +
        overhead). 1 until a full batch was measured: below saturation the overhead costs latency only."""
        if self.full_work_s is None or self.full_work_s <= 0:
            return 1.0
        return self.full_work_s / (self.full_work_s + self.overhead_s)

    @property
    def corrects(self) -> bool:
        """Whether `saturation_factor` is known: a full batch and the per-task fit were measured."""
        return self.full_work_s is not None and self.tasks.fit() is not None

    def saturation_factor(self, records: float | None) -> float:
        """The DS2 rate a full batch shows over the one measured at `records` per task: x / (task_s +
        x work_s) at the full batch's x over that at `records`. 1 until a full batch and the per-task
        fit are known, and never below 1 (at most MAX_SATURATION_FACTOR)."""
        fit = self.tasks.fit()
        if fit is None or records is None or records <= 0 or self.full_work_s is None:
            return 1.0
        fixed, per_record = fit
        full = (self.full_work_s - fixed) / per_record
        if full <= records:
            return 1.0

        def rate(x: float) -> float:
            return x / (fixed + x * per_record)

        return min(MAX_SATURATION_FACTOR, rate(full) / rate(records))

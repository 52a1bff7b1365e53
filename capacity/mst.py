"""Maximum sustainable throughput (MST) of one configuration, by a dichotomous search over
injected rates (StreamBed's Capacity Estimator, its section IV).

After a warm-up at a high rate, each step injects a fixed rate, waits for the job to settle and then
measures: the step succeeds when the job processed at least 99 % of the injected rate and its backlog
did not grow. StreamBed starts between zero and the testbed's maximal injection rate; without a known
ceiling the search first doubles its rate from a guess until a step fails (or halves it until one
succeeds); from a good guess (the MST measured on fewer slots, extrapolated) a smaller `growth` brackets
it in fewer steps. The bounds then close in (success raises the lower one, failure lowers the upper
one) until the next target is within 1 % of the last, or after a maximum number of steps. The MST is
the highest rate that succeeded.

A micro-batch engine (Spark) admits records a batch at a time, so a rate measured over a fixed window
is off by up to one batch: a 5-s batch in a 20-s window is 25 %. `step_from_batches` measures between
batch starts instead: the records the source admitted from the first to the last batch start in the
window, over that time, and the backlog (log end minus admitted end) at each, exact to a record.

Pure: `Dichotomy` is a small state machine (`target`, `update`, `done`, `mst`); a testbed shell runs
the job at each target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

SUCCESS_SHARE = 0.99  # processed / injected for a step to count as sustained
MAX_BACKLOG_GROWTH_S = 1.0  # a backlog grown by more than this many seconds of input has not kept up
SENSIBILITY = 0.01  # stop when the next target is within 1 % of the last
MAX_STEPS = 24
MIN_BATCHES = 3  # batch starts a batch-aligned step needs (two intervals between them)


@dataclass(frozen=True)
class Step:
    """What a testbed measured at one injected rate (after its settling time)."""

    injected: float  # records/s offered
    processed: float  # records/s the job completed over the measurement
    backlog_growth: float  # records the backlog grew by over the measurement (negative: it shrank)
    measured_s: float

    @property
    def sustained(self) -> bool:
        if self.injected <= 0:
            return True
        kept_up = self.processed >= SUCCESS_SHARE * self.injected
        return kept_up and self.backlog_growth <= MAX_BACKLOG_GROWTH_S * self.injected


@dataclass(frozen=True)
class Batch:
    """One micro-batch as its source planned it: when it started, the source's end offset after it
    (summed over partitions) and the log end the source saw then."""

    start: float  # epoch s
    admitted_end: int
    log_end: int

    @property
    def backlog(self) -> int:
        return max(0, self.log_end - self.admitted_end)


def step_from_batches(injected: float, batches: Sequence[Batch]) -> Step:
    """A step measured between the first and the last of `batches` (in start order, at least
    MIN_BATCHES): what the source admitted per second, and how the backlog changed."""
    if len(batches) < MIN_BATCHES:
        raise ValueError(f"a batch-aligned step needs {MIN_BATCHES} batches, got {len(batches)}")
    first, last = batches[0], batches[-1]
    span = last.start - first.start
    if span <= 0:
        raise ValueError("the batches must start at increasing times")
    admitted = last.admitted_end - first.admitted_end
    return Step(injected, admitted / span, float(last.backlog - first.backlog), span)


@dataclass
class Dichotomy:
    """The search between `low` (sustained) and `high` (not sustained, or the testbed's ceiling;
    infinite until a step fails, while the rate grows by `growth` from `start`). While nothing has
    been sustained, a failed step's rate is divided by `growth` (with 2, StreamBed's halving)."""

    start: float
    high: float = math.inf
    low: float = 0.0
    max_steps: int = MAX_STEPS
    sensibility: float = SENSIBILITY
    growth: float = 2.0
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.start > 0 and self.high > self.low >= 0 and self.growth > 1):
            raise ValueError(f"the search needs start > 0, 0 <= low < high and growth > 1, got {self.start}, "
                             f"{self.low}, {self.high}, {self.growth}")

    def target(self) -> float:
        """The next rate to inject: the start, then grow while nothing failed (shrink while nothing
        succeeded), then halfway."""
        if not self.steps:
            return min(self.start, (self.low + self.high) / 2) if math.isfinite(self.high) else self.start
        if math.isinf(self.high):
            return max(self.low, self.start) * self.growth
        if self.low == 0:
            return self.high / self.growth
        return (self.low + self.high) / 2

    def update(self, step: Step) -> None:
        self.steps.append(step)
        if step.sustained:
            self.low = max(self.low, step.injected)
        else:
            self.high = min(self.high, step.injected)

    @property
    def done(self) -> bool:
        if len(self.steps) >= self.max_steps:
            return True
        last = self.steps[-1].injected if self.steps else None
        return (last is not None and math.isfinite(self.high)
                and abs(self.target() - last) <= self.sensibility * last)

    @property
    def mst(self) -> float:
        """The highest rate sustained so far (0 if none was)."""
        return self.low

"""Maximum sustainable throughput (MST) of one configuration, by a dichotomous search over
injected rates (StreamBed's Capacity Estimator, its section IV).

After a warm-up at a high rate, each step injects a fixed rate, waits for the job to settle and then
measures: the step succeeds when the job processed at least 99 % of the injected rate and its backlog
did not grow. StreamBed starts between zero and the testbed's maximal injection rate; without a known
ceiling the search first doubles its rate from a guess until a step fails. The bounds then close
in (success raises the lower one, failure lowers the upper one) until
the next target is within 1 % of the last, or after a maximum number of steps. The MST is the highest
rate that succeeded.

Pure: `Dichotomy` is a small state machine (`target`, `update`, `done`, `mst`); a testbed shell runs
the job at each target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SUCCESS_SHARE = 0.99  # processed / injected for a step to count as sustained
MAX_BACKLOG_GROWTH_S = 1.0  # a backlog grown by more than this many seconds of input has not kept up
SENSIBILITY = 0.01  # stop when the next target is within 1 % of the last
MAX_STEPS = 24


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


@dataclass
class Dichotomy:
    """The search between `low` (sustained) and `high` (not sustained, or the testbed's ceiling;
    infinite until a step fails, while the rate doubles from `start`)."""

    start: float
    high: float = math.inf
    low: float = 0.0
    max_steps: int = MAX_STEPS
    sensibility: float = SENSIBILITY
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.start > 0 and self.high > self.low >= 0):
            raise ValueError(f"the search needs start > 0 and 0 <= low < high, got {self.start}, {self.low}, "
                             f"{self.high}")

    def target(self) -> float:
        """The next rate to inject: the start, then double while nothing failed, then halfway."""
        if not self.steps:
            return min(self.start, (self.low + self.high) / 2) if math.isfinite(self.high) else self.start
        if math.isinf(self.high):
            return max(self.low, self.start) * 2
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

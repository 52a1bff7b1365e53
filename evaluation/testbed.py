"""The evaluation's job model as a capacity-planning testbed, whose truth is known.

`ModelTestbed.run(slots, rate)` does what a live testbed run does: the job starts at `slots` with an
empty backlog, a fixed rate is injected, the first `settle_s` are left out, and the next `measure_s`
are measured (records processed, backlog growth), window by window with the model's rate noise (a
fresh realisation per run, from `seed`). `truth(slots)` is the model's noiseless capacity, which a
planner never sees: the accuracy of its predictions is measured against it at scales this machine
cannot run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from evaluation.jobmodel import EPOCH, JobModel, JobState, Operator, advance
from evaluation.simulator import rate_factors
from plan.capacity.mst import Step

WINDOW_S = 10.0


@dataclass
class ModelTestbed:
    model: JobModel
    rate_noise: float = 0.0
    seed: int = 0
    settle_s: float = 60.0
    measure_s: float = 120.0
    runs: int = field(default=0, init=False)

    def run(self, slots: int, rate: float) -> Step:
        windows = math.ceil((self.settle_s + self.measure_s) / WINDOW_S)
        factors = rate_factors(windows, self.seed * 1_000_003 + self.runs, self.rate_noise)
        self.runs += 1
        state = JobState([slots] * (1 if self.model.fused else len(self.model.operators)))
        processed = 0.0
        backlog_at_start = 0.0
        for i in range(windows):
            t = i * WINDOW_S
            if t == self.settle_s:
                backlog_at_start = state.backlog
            outcome = advance(self.model, state, EPOCH + t, WINDOW_S, rate, float(factors[i]))
            if t >= self.settle_s:
                processed += outcome.processed
        measured = windows * WINDOW_S - self.settle_s
        return Step(rate, processed / measured, state.backlog - backlog_at_start, measured)

    def truth(self, slots: int) -> float:
        return self.model.capacity(slots)


def scaling_truths(slot_rate: float = 100.0) -> dict[str, JobModel]:
    """Three jobs whose scaling is known: linear, sub-linear (Universal Scalability Law with contention
    and coherency) and knee-shaped (each slot beyond the fifth adds 60 % of one). Work per record only:
    no fixed costs per micro-batch, so that the shape is the operator's."""

    def job(operator: Operator) -> JobModel:
        return JobModel(operators=(operator,), fused=True, partitions=4096)

    return {
        "linear": job(Operator("linear", slot_rate)),
        "usl": job(Operator("usl", slot_rate, contention=0.02, coherency=0.00005)),
        "knee": job(Operator("knee", slot_rate, knee=5, efficiency_beyond_knee=0.6)),
    }

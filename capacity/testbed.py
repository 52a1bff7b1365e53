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

from capacity.explore import measure_mst
from capacity.mst import Step
from capacity.profiles import Profile
from evaluation.jobmodel import EPOCH, JobModel, JobState, Operator, advance
from evaluation.simulator import rate_factors

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


@dataclass(frozen=True)
class ProfileTruth:
    """A stateful job whose executor throughput depends on its profile in a known way (QEScalor's
    compute-and-memory operator): `core_rate` records/s per core, sub-linear in the cores of one
    executor (`core_exponent`: its tasks share one JVM's heap, GC and shuffle); each core's tasks hold
    `state_gb_per_core` of state besides `base_gb` for the JVM, and an executor with less memory than
    that spills, losing throughput with the square of the shortfall down to `spill_floor`. Executors
    add up (QEScalor's sum over instances)."""

    core_rate: float = 100.0
    core_exponent: float = 0.9
    base_gb: float = 0.5
    state_gb_per_core: float = 1.0
    spill_floor: float = 0.3

    def needed_gb(self, cores: int) -> float:
        return self.base_gb + self.state_gb_per_core * cores

    def executor_mst(self, profile: Profile) -> float:
        share = min(1.0, profile.memory_gb / self.needed_gb(profile.cores))
        memory = self.spill_floor + (1 - self.spill_floor) * share**2
        return self.core_rate * profile.cores**self.core_exponent * memory


@dataclass
class ProfileTestbed:
    """Measures one executor of a profile as StreamBed measures a configuration (`measure_mst`: the
    dichotomy over injected rates, on the job model with its rate noise, settling then measuring)."""

    truth: ProfileTruth
    rate_noise: float = 0.043
    seed: int = 0
    measure_s: float = 300.0
    start_rate: float = 10.0
    slot_seconds: float = field(default=0.0, init=False)
    measured: int = field(default=0, init=False)

    def measure(self, profile: Profile) -> float | None:
        """One executor's MST at `profile`; None when no rate was sustained, twice (`measure_mst`)."""
        job = JobModel(operators=(Operator("executor", self.truth.executor_mst(profile)),), fused=True,
                       partitions=4096)
        testbed = ModelTestbed(job, rate_noise=self.rate_noise, seed=self.seed * 7919 + self.measured,
                               measure_s=self.measure_s)
        self.measured += 1
        found = measure_mst(testbed, 1, self.start_rate)
        self.slot_seconds += profile.cores * found.slot_seconds
        return found.mst if found.stable else None


def profile_truths() -> dict[str, ProfileTruth]:
    """Three jobs whose executor profiles matter differently: state of 1 GB per core (the default);
    compute-bound (a quarter of a GB per core, cores scale almost linearly); state-heavy (2 GB per
    core and a 1-GB JVM: 4 cores need 9 GB)."""
    return {"stateful": ProfileTruth(),
            "compute": ProfileTruth(state_gb_per_core=0.25, core_exponent=0.95),
            "state-heavy": ProfileTruth(state_gb_per_core=2.0, base_gb=1.0)}

"""A trace-driven model of a streaming job, fast enough to replay hours of load in a fraction of a second.

Pure: no I/O. The job is a chain of operators; each has a per-instance true processing rate
(records/s one instance handles while 100 % busy), a selectivity (output records per input record),
a skew (the busiest instance receives (1 + skew) / p of the operator's input instead of 1 / p), a
knee beyond which extra instances add only a fraction of one (non-linear scaling: coordination,
shared resources) and Universal Scalability Law terms (Gunther): p instances do the work of
p / (1 + contention (p - 1) + coherency p (p - 1)), which peaks and then falls when coherency > 0.
The source has partitions and a backlog.

Two layouts:
- `fused` (Spark Structured Streaming): one parallelism, every task slot runs the whole chain, so a
  source record costs each slot the sum over operators of (records reaching it / its rate).
- per operator (Flink, DS2's setting): each operator has its own parallelism and the slowest one,
  relative to the records reaching it, bounds the job (backpressure).

Time advances in windows (the agents' loop interval). Within a window the arrival rate and the
capacity are constant, so the processed records have a closed form: min(backlog + arrivals,
capacity x running time), which is exact for a constant rate (the backlog drains, then follows the
arrivals). A rescale stops the job for a restart downtime: nothing is processed, the arrivals pile
up, the new parallelism is paid from the decision on, and the records processed since the last
checkpoint are processed again. A job whose executors are changed in place (`in_place`) is never
restarted: a scale-up runs at the old capacity for `ramp_up_s` (until the new executors registered;
the new ones are paid from the decision on), a scale-down stops processing for `hold_down_s` (the
query held between two batches), and nothing is replayed.

A stateful job (`state_partitions`: a windowed aggregation, a deduplication, a join in Spark) keeps
its state in that many partitions, fixed at its first start: slots beyond them run no stateful task,
and slots that do not divide them run the stateful stages in ceil(partitions / p) waves, so p slots
work as partitions / ceil(partitions / p) busy ones. Its state holds `state_retention_s` of arrivals
(the window and the watermark's delay), and a restart reloads it: `restart_s_per_million_rows` more
per million rows.

The model produces the public `MetricReport`s the Spark reporter would send (`reports`), so the
project's own monitor, analyze and plan code can be driven by it (see `evaluation.suite`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.messages import MetricReport, OperatorMetrics, SourceMetrics, StateOperatorMetrics

EPOCH = 1_700_000_000.0  # metric time of simulated second 0 (window-aligned)


@dataclass(frozen=True)
class Operator:
    name: str
    rate_per_instance: float  # records/s at 100 % busy, at or below the knee
    selectivity: float = 1.0
    skew: float = 0.0
    knee: int | None = None
    efficiency_beyond_knee: float = 1.0  # what each instance beyond the knee adds, as a fraction of one
    contention: float = 0.0  # USL: the serial share
    coherency: float = 0.0  # USL: the cost of keeping instances consistent, per pair

    def __post_init__(self) -> None:
        if self.rate_per_instance <= 0 or self.selectivity < 0 or self.skew < 0:
            raise ValueError(f"operator {self.name}: rate must be > 0, selectivity and skew >= 0")
        if (self.knee is not None and self.knee < 1) or not 0 <= self.efficiency_beyond_knee <= 1:
            raise ValueError(f"operator {self.name}: knee must be >= 1 and efficiency in [0, 1]")
        if not (0 <= self.contention <= 1 and 0 <= self.coherency <= 1):
            raise ValueError(f"operator {self.name}: contention and coherency must be in [0, 1]")

    def effective_instances(self, p: int) -> float:
        base = float(p) if self.knee is None or p <= self.knee else self.knee + (p - self.knee) * \
            self.efficiency_beyond_knee
        return base / (1 + self.contention * (p - 1) + self.coherency * p * (p - 1))

    def instance_rate(self, p: int) -> float:
        """The true processing rate of one instance at parallelism p, as DS2 measures it."""
        return self.rate_per_instance * self.effective_instances(p) / p

    def busiest_share(self, p: int) -> float:
        return 1.0 if p <= 1 else min(1.0, (1.0 + self.skew) / p)

    def capacity(self, p: int) -> float:
        """Input rate (records/s) at which its busiest instance saturates."""
        return self.instance_rate(p) / self.busiest_share(p)


@dataclass(frozen=True)
class JobModel:
    operators: tuple[Operator, ...]
    fused: bool = True
    partitions: int = 64
    splittable: bool = True
    checkpoint_interval_s: float = 5.0
    downtime_up_s: float = 20.0
    downtime_down_s: float = 20.0
    in_place: bool = False  # executors changed in place (no restart): the two times below apply instead
    ramp_up_s: float = 0.0
    hold_down_s: float = 0.0
    # Micro-batches (fused layout): each costs a fixed batch_overhead_s of wall time beyond its work;
    # each of its tasks (one per slot) a fixed task_overhead_s of busy time beyond its records; a full
    # batch holds batch_work_s busy seconds per slot, task cost included. A saturated job runs at
    # (batch_work_s - task_overhead_s) / (batch_work_s + batch_overhead_s) of its slots' rate, and
    # DS2's rate (records per busy second) is lower for small batches than for full ones.
    batch_overhead_s: float = 0.0
    batch_work_s: float = 5.0
    task_overhead_s: float = 0.0
    # A processing-time trigger starts a micro-batch at most every trigger_interval_s (0: back to back):
    # a job with little to do runs fewer batches, so fewer task costs, than one without a trigger.
    trigger_interval_s: float = 0.0
    # A stateful job: its state partitions (None: stateless), the seconds of arrivals its state holds,
    # the restart's extra seconds per million rows of state, and a row's size in memory.
    state_partitions: int | None = None
    state_retention_s: float = 0.0
    restart_s_per_million_rows: float = 0.0
    state_row_bytes: int = 200

    def __post_init__(self) -> None:
        if self.state_partitions is not None and self.state_partitions < 1:
            raise ValueError("state partitions must be >= 1")
        if min(self.state_retention_s, self.restart_s_per_million_rows, self.state_row_bytes) < 0:
            raise ValueError("the state's retention, its restart cost and its row size must be >= 0")
        if not self.operators:
            raise ValueError("a job needs at least one operator")
        if self.batch_overhead_s < 0 or self.batch_work_s <= 0:
            raise ValueError("batch overhead must be >= 0 and batch work > 0")
        if not 0 <= self.task_overhead_s < self.batch_work_s:
            raise ValueError("the task overhead must be >= 0 and less than a full batch's work")
        if self.trigger_interval_s < 0:
            raise ValueError("the trigger interval must be >= 0")
        if min(self.downtime_up_s, self.downtime_down_s, self.ramp_up_s, self.hold_down_s) < 0:
            raise ValueError("downtimes, the ramp and the hold must be >= 0")
        if self.in_place and not self.fused:
            raise ValueError("executors are changed in place for a fused (Spark) job only")

    def reaching(self) -> list[float]:
        """Records reaching each operator per source record (the product of upstream selectivities)."""
        out, factor = [], 1.0
        for op in self.operators:
            out.append(factor)
            factor *= op.selectivity
        return out

    def usable(self, p: int) -> int:
        return p if self.splittable else min(p, self.partitions)

    def slot_seconds_per_record(self, p: int) -> float:
        """Fused layout: busy slot-seconds one source record costs at parallelism p."""
        q = self.usable(p)
        return sum(r / op.instance_rate(q) for r, op in zip(self.reaching(), self.operators, strict=True))

    def capacity(self, parallelism: int | Sequence[int]) -> float:
        """Source records/s the job sustains: all slots fused, or the bottleneck operator."""
        if self.fused:
            p = parallelism if isinstance(parallelism, int) else max(parallelism)
            q = self.usable(p)
            skew = max(op.skew for op in self.operators)
            share = 1.0 if q <= 1 else min(1.0, (1.0 + skew) / q)
            return self.batch_efficiency * self.in_waves(q) / (self.slot_seconds_per_record(p) * share)
        ps = [parallelism] * len(self.operators) if isinstance(parallelism, int) else list(parallelism)
        return min(op.capacity(self.usable(p)) / r
                   for op, p, r in zip(self.operators, ps, self.reaching(), strict=True))

    def in_waves(self, q: int) -> float:
        """The share of q slots a stateful job keeps busy: its state partitions run in ceil(T / q) waves."""
        if self.state_partitions is None:
            return 1.0
        t = self.state_partitions
        return t / math.ceil(t / q) / q

    def state_rows(self, arrival_rate: float) -> float:
        """Rows in state at a steady arrival rate (0 for a stateless job)."""
        return arrival_rate * self.state_retention_s if self.state_partitions is not None else 0.0

    @property
    def batch_efficiency(self) -> float:
        """The share of a saturated micro-batch's wall time its slots spend on records."""
        if not self.fused:
            return 1.0
        return (self.batch_work_s - self.task_overhead_s) / (self.batch_work_s + self.batch_overhead_s)

    @property
    def batched(self) -> bool:
        """Whether the job runs micro-batches with a fixed cost (and reports them)."""
        return self.fused and (self.batch_overhead_s > 0 or self.task_overhead_s > 0)

    def downtime(self, from_p: int, to_p: int) -> float:
        """How long a rescale stops processing: a restart, or an in-place scale-down's hold."""
        if self.in_place:
            return 0.0 if to_p > from_p else self.hold_down_s
        return self.downtime_up_s if to_p > from_p else self.downtime_down_s

    def ramp(self, from_p: int, to_p: int) -> float:
        """How long a rescale runs at the old capacity: an in-place scale-up's executors registering."""
        return self.ramp_up_s if self.in_place and to_p > from_p else 0.0


@dataclass
class JobState:
    parallelism: list[int]  # one per operator (all equal when fused)
    backlog: float = 0.0
    restart_until: float = -math.inf
    ramp_until: float = -math.inf  # an in-place scale-up runs at `ramp_from`'s capacity until then
    ramp_from: int = 0
    last_rate: float = 0.0  # processing rate of the last window (records/s), for the replay
    state_rows: float = 0.0  # rows in a stateful job's state
    # Accounting over the run.
    slot_seconds: float = 0.0
    busy_slot_seconds: float = 0.0
    processed: float = 0.0
    arrived: float = 0.0
    replayed: float = 0.0
    history: list[tuple[float, int, float, float, float]] = field(default_factory=list)  # t, p, arrival, cap, backlog

    @property
    def job_parallelism(self) -> int:
        return max(self.parallelism)


@dataclass(frozen=True)
class WindowOutcome:
    processed: float
    running_s: float
    capacity: float
    busy_slot_s: float
    batches: int | None = None  # micro-batches run (None for a model without them)
    batch_time_s: float | None = None  # wall time the batches ran (waits for the trigger left out)


def rescale(model: JobModel, state: JobState, to: int | Sequence[int], at: float) -> float:
    """Start a rescale at metric time `at`; returns how long it lasts (its pause and its ramp)."""
    new = [to] * len(state.parallelism) if isinstance(to, int) else list(to)
    downtime = model.downtime(state.job_parallelism, max(new))
    ramp = model.ramp(state.job_parallelism, max(new))
    if not model.in_place:
        downtime += model.restart_s_per_million_rows * state.state_rows / 1e6  # the state reloaded
        # Micro-batches since the last checkpoint are processed again after the restart.
        since_checkpoint = at % model.checkpoint_interval_s if model.checkpoint_interval_s > 0 else 0.0
        replay = state.last_rate * since_checkpoint
        state.backlog += replay
        state.replayed += replay
    if ramp > 0:
        state.ramp_from, state.ramp_until = state.job_parallelism, at + ramp
    state.parallelism = new
    state.restart_until = at + downtime
    return downtime + ramp


def advance(model: JobModel, state: JobState, start: float, length_s: float, arrival_rate: float,
            rate_factor: float = 1.0) -> WindowOutcome:
    """Process [start, start + length_s) at a constant arrival rate; `rate_factor` scales every
    instance's rate for this interval (noise: GC pauses, co-located load)."""
    running = max(0.0, min(length_s, start + length_s - max(start, state.restart_until)))
    capacity = model.capacity(state.parallelism if not model.fused else state.job_parallelism) * rate_factor
    # An in-place scale-up's ramp: the old executors alone process until the new ones registered.
    old_s = min(running, max(0.0, state.ramp_until - max(start, state.restart_until)))
    old_capacity = model.capacity(state.ramp_from) * rate_factor if old_s > 0 else 0.0
    arrivals = arrival_rate * length_s
    can_process = capacity * (running - old_s) + old_capacity * old_s
    processed = min(state.backlog + arrivals, can_process)
    # Floating-point round-off must not leave a backlog (and so a busy time) a hair below zero.
    state.backlog = max(0.0, state.backlog + arrivals - processed)
    paid = sum(state.parallelism) if not model.fused else state.job_parallelism
    batches = batch_time = None
    if model.fused:
        on_old = processed * old_capacity * old_s / can_process if old_s > 0 else 0.0
        busy = (processed - on_old) * model.slot_seconds_per_record(state.job_parallelism) / rate_factor
        if on_old > 0:
            busy += on_old * model.slot_seconds_per_record(state.ramp_from) / rate_factor
        share = busy / (paid * running) if processed > 0 else 0.0
        batches = micro_batches(model, running, share) if processed > 0 else None
        if batches is not None:
            # Each batch runs its fixed costs and its work; a triggered job that keeps ahead of its
            # trigger waits between them, one that does not runs them back to back.
            waits = _back_to_back_s(model, share) < model.trigger_interval_s
            batch_time = min(running, batches * _fixed_s(model) + share * running) if waits else running
        busy += (batches or 0) * paid * model.task_overhead_s
    else:
        busy = sum(processed * r / (op.instance_rate(model.usable(p)) * rate_factor)
                   for op, p, r in zip(model.operators, state.parallelism, model.reaching(), strict=True))
    state.slot_seconds += paid * length_s
    state.busy_slot_seconds += busy
    state.processed += processed
    state.arrived += arrivals
    state.state_rows = model.state_rows(arrival_rate)
    if running > 0:
        state.last_rate = processed / running
    return WindowOutcome(processed, running, capacity, busy, batches, batch_time)


def micro_batches(model: JobModel, running_s: float, work_share: float) -> int | None:
    """The micro-batches a fused job with fixed costs runs back to back in `running_s`, its slots
    working `work_share` of it on records (task costs left out); None for a model without batches.

    A batch takes its fixed costs (the batch's and its tasks') plus the work on what arrived during
    the one before: d = (overhead + task overhead) / (1 - share), at most overhead + a full batch's
    work (saturated), and at least the trigger interval (a batch that finishes early waits for it).
    The analysis then measures exactly the model's batch overhead: (batch time - busy per slot) /
    batches, with a batch time of batches x (fixed costs) + share x running_s."""
    if not model.batched or running_s <= 0:
        return None
    full = model.batch_overhead_s + model.batch_work_s
    duration = min(full, max(model.trigger_interval_s, _back_to_back_s(model, work_share)))
    return max(1, round(running_s / duration))


def _fixed_s(model: JobModel) -> float:
    """A micro-batch's fixed wall time: the batch's overhead and its tasks'."""
    return model.batch_overhead_s + model.task_overhead_s


def _back_to_back_s(model: JobModel, work_share: float) -> float:
    """How long a batch takes when each holds what arrived during the one before (no trigger):
    its fixed costs over the share of time not spent on records (unbounded when saturated)."""
    return _fixed_s(model) / (1 - work_share) if work_share < 1 else math.inf


def report(model: JobModel, state: JobState, job_id: str, end: float, outcome: WindowOutcome,
           arrival_rate: float) -> MetricReport | None:
    """What the job's reporter sends for an interval ending at `end` (None while it was down)."""
    if outcome.running_s <= 0:
        return None
    # Live, the reporter learns the new parallelism when the new executors registered.
    p = state.ramp_from if end <= state.ramp_until else state.job_parallelism
    records = round(outcome.processed)
    reaching = model.reaching()
    out_factor = reaching[-1] * model.operators[-1].selectivity
    operators = []
    if not model.fused:
        previous: list[str] = []
        for op, q, r in zip(model.operators, state.parallelism, reaching, strict=True):
            rec_in = round(outcome.processed * r)
            operators.append(OperatorMetrics(
                operator_id=op.name, upstream=previous, parallelism=q, records_in=rec_in,
                records_out=round(rec_in * op.selectivity),
                busy_time_s=rec_in / op.instance_rate(model.usable(q)) if rec_in else 0.0,
                arrival_rate=arrival_rate if not previous else None,
            ))
            previous = [op.name]
    utilization = min(1.0, outcome.busy_slot_s / (p * outcome.running_s))
    batches = outcome.batches if records else None
    batch_time = outcome.batch_time_s if batches else None
    return MetricReport(
        job_id=job_id, timestamp=end, interval_s=outcome.running_s, parallelism=p, records_in=records,
        records_out=round(outcome.processed * out_factor), busy_time_s=outcome.busy_slot_s,
        cpu_utilization=utilization, batches=batches, batch_time_s=batch_time,
        source=SourceMetrics(arrival_rate=arrival_rate, backlog=round(state.backlog), partitions=model.partitions,
                             splittable=model.splittable),
        operators=operators,
        state=[] if model.state_partitions is None else [StateOperatorMetrics(
            operator="stateStoreSave", rows=round(state.state_rows),
            memory_bytes=round(state.state_rows * model.state_row_bytes), partitions=model.state_partitions)],
    )

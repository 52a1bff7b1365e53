"""Job-model files: what a job was measured to do, as the simulator replays it.

`autoscaler calibrate` measures the running job (per-slot rate at each parallelism, the fixed costs
per micro-batch and per task, the restart time per direction, the rate noise) and writes one of these files;
`autoscaler evaluate --job-model FILE` replays the traces with it. Without a file the evaluation uses
the demo job's, shipped in `evaluation/models/demo.json` with the measurement behind it.

Pure apart from reading and writing the file: the scaling fit is a small least-squares search.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evaluation.jobmodel import JobModel, Operator

DEMO_MODEL_FILE = Path(__file__).parent / "models" / "demo.json"
# Seconds a new Spark process runs at a low load before it is measured (calibrate) or autoscaled in a live
# evaluation: its cost per micro-batch falls over its first hundred or so batches (docs/spark.md).
WARM_UP_S = 150.0

PositiveSeconds = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]


class JobModelError(ValueError):
    """A job-model file that cannot be read or does not describe a job."""


class JobModelFile(BaseModel):
    """One job as measured: the fused (Spark) layout with one operator whose per-slot rate falls
    beyond a knee (each further slot adds `efficiency_beyond_knee` of one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    name: str = Field(min_length=1, max_length=128)
    slot_rate: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="Records per busy second of one slot at or below the knee (DS2's true rate).")
    knee: Annotated[int, Field(ge=1)] | None = None
    efficiency_beyond_knee: Annotated[float, Field(ge=0, le=1)] = 1.0
    contention: Annotated[float, Field(ge=0, le=1)] = Field(0.0, description="Universal Scalability Law: serial share.")
    coherency: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="Universal Scalability Law: cost per pair of slots (> 0: capacity peaks, then falls).")
    batch_overhead_s: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = Field(
        0.0, description="Fixed wall time per micro-batch beyond the slots' work.")
    batch_work_s: PositiveSeconds = Field(
        5.0, description="Slot-seconds of work per slot in a full micro-batch (the source's per-trigger cap).")
    task_overhead_s: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = Field(
        0.0, description="Busy seconds each task (one per slot per batch) costs beyond its records: DS2's rate "
                         "is lower for small batches by it.")
    downtime_up_s: PositiveSeconds
    downtime_down_s: PositiveSeconds
    ramp_up_s: PositiveSeconds | None = Field(
        None, description="In place (executors changed on a standalone cluster): seconds from the decision until a "
                          "scale-up's new executors registered; the job runs at its old capacity meanwhile.")
    hold_down_s: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] | None = Field(
        None, description="In place: seconds a scale-down holds the query between two micro-batches.")
    rate_noise: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = Field(
        description="Log-sd of the per-window processing rate (10-s windows).")
    checkpoint_interval_s: PositiveSeconds = 5.0
    trigger_interval_s: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = Field(
        0.0, description="The job's processing-time trigger: a micro-batch starts at most this often (0: back to "
                         "back).")
    partitions: Annotated[int, Field(ge=1, le=100_000)] = 64
    measured: dict[str, Any] = Field(default_factory=dict, description="How, when and what was measured.")

    def model(self, in_place: bool = False) -> JobModel:
        """The job as the simulator replays it; `in_place`: rescaled by changing its executors in place
        (the file's `ramp_up_s` and `hold_down_s`), not by restarts."""
        if self.task_overhead_s >= self.batch_work_s:
            raise JobModelError("task_overhead_s must be less than batch_work_s (a full batch's work per slot)")
        if in_place and (self.ramp_up_s is None or self.hold_down_s is None):
            raise JobModelError(f"the job model {self.name!r} has no in-place times (ramp_up_s, hold_down_s): "
                                "measure them with `python -m bench.inplace_live`")
        # slot_rate is DS2's rate over full batches, task costs included: per record, a slot is faster.
        per_record = self.slot_rate * self.batch_work_s / (self.batch_work_s - self.task_overhead_s)
        operator = Operator(self.name, per_record, knee=self.knee, efficiency_beyond_knee=self.efficiency_beyond_knee,
                            contention=self.contention, coherency=self.coherency)
        return JobModel(operators=(operator,), fused=True, partitions=self.partitions,
                        checkpoint_interval_s=self.checkpoint_interval_s, downtime_up_s=self.downtime_up_s,
                        downtime_down_s=self.downtime_down_s, batch_overhead_s=self.batch_overhead_s,
                        batch_work_s=self.batch_work_s, task_overhead_s=self.task_overhead_s,
                        trigger_interval_s=self.trigger_interval_s, in_place=in_place,
                        ramp_up_s=self.ramp_up_s or 0.0, hold_down_s=self.hold_down_s or 0.0)


def load_job_model(path: str | Path | None = None) -> JobModelFile:
    """The job model in `path` (default: the demo job's); a clear error if it is not one."""
    path = Path(path) if path is not None else DEMO_MODEL_FILE
    try:
        return JobModelFile.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise JobModelError(f"cannot read the job model {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors()[:5])
        raise JobModelError(f"{path} is not a job model: {problems}") from None


def write_job_model(model: JobModelFile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.model_dump(mode="json"), indent=1) + "\n")
    return path


def fit_scaling(rates: dict[int, float]) -> tuple[float, int | None, float]:
    """(slot_rate, knee, efficiency_beyond_knee) whose per-slot rates best match the measured ones
    (per-slot DS2 rate at each parallelism), in log terms; a knee at or beyond the largest measured
    parallelism means no knee was seen (None, efficiency 1)."""
    points = sorted((p, r) for p, r in rates.items() if p >= 1 and r > 0)
    if not points:
        raise JobModelError("no per-slot rate was measured")
    top = points[-1][0]
    best: tuple[float, float, int | None, float] | None = None
    for knee in range(1, top + 1):
        for step in range(0, 21):
            efficiency = step / 20
            shape = {p: (p if p <= knee else knee + (p - knee) * efficiency) / p for p, _ in points}
            # The slot rate that fits best for this shape: the geometric mean of rate / shape.
            log_rate = sum(math.log(r / shape[p]) for p, r in points) / len(points)
            error = sum((math.log(r / shape[p]) - log_rate) ** 2 for p, r in points)
            kept_knee = None if knee >= top or step == 20 else knee  # efficiency 1: no knee
            candidate = (error, math.exp(log_rate), kept_knee, efficiency if kept_knee else 1.0)
            if best is None or candidate[0] < best[0] - 1e-12:
                best = candidate
    assert best is not None
    return best[1], best[2], best[3]


@cache
def demo_job_model() -> JobModelFile:
    """The demo job's model file (read once)."""
    return load_job_model(DEMO_MODEL_FILE)


def demo_model() -> JobModel:
    return demo_job_model().model()

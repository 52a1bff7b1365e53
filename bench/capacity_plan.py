"""`python -m bench.capacity_plan`: how far StreamBed's capacity plan extrapolates, against the truth.

The testbed is the evaluation's job model (`capacity.testbed.ModelTestbed`), with three jobs whose
scaling is known (linear; sub-linear by the Universal Scalability Law, contention 0.02 and coherency
0.00005; a knee at 5 slots beyond which each slot adds 60 % of one) and the demo job's model. Per job
and noise seed (log-normal rate noise of 4.3 % per 10-s window, the demo job's measured noise), the
planner measures MSTs on at most `--max-slots` slots (60 s settling and `--measure-s` per injected
rate), fits the scaling models and predicts the MST at 32 and 64 slots. It is then asked for a rate
equal to the true MST at 32 slots: the answer is run on the testbed at that rate (does it sustain
it?) and its true capacity set against the rate (how much is it oversized?).

Then the plan's use: a new job of the demo job's model starts at 1 slot under a quarter of the peak
(150 rec/s) for an hour, then the load steps to the peak (600 rec/s, x4) for an hour, in the one
simulator under the default policy (no forecast), once without a planned capacity and once seeded
with the plan (`planned_capacity` in its configuration, as `autoscaler capacity plan --job` writes
it), same noise. Counted after the step: scale-ups, the first one's target, the parallelism that
held, the peak backlog and the time beyond the backlog target. Prints tables and writes JSON;
medians and worst cases over the seeds.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console

from bench.common import RESULTS, table, write_result
from capacity.cli import planned_curve
from capacity.explore import HEADROOM, LARGEST_ANSWER, MIN_AFTER_CORNERS, explore, recommend
from capacity.mst import SENSIBILITY
from capacity.testbed import WINDOW_S, ModelTestbed, scaling_truths
from contracts.jobs import JobConfig, format_planned_capacity
from evaluation.jobmodel import JobModel
from evaluation.model_files import demo_job_model
from evaluation.simulator import PolicyRunner, simulate, static_parallelism
from evaluation.traces import load_trace
from plan.registry import make_policy

NOISE = 0.043
START_RATE = 10.0  # rec/s where the first search starts, far below every job's MST: no hint of the truth
FAR = (32, 64)
app = typer.Typer(add_completion=False, help=__doc__)


def one_plan(name: str, model: JobModel, seed: int, max_slots: int, measure_s: float,
             sensibility: float = SENSIBILITY, min_after_corners: int = MIN_AFTER_CORNERS) -> dict[str, Any]:
    started = time.perf_counter()
    testbed = ModelTestbed(model, rate_noise=NOISE, seed=seed, measure_s=measure_s)
    exploration = explore(testbed, list(range(1, max_slots + 1)), first_guess=START_RATE, seed=seed,
                          sensibility=sensibility, min_after_corners=min_after_corners)
    fit = exploration.model
    rate = model.capacity(32)
    answer = recommend(exploration.fits, rate)
    row: dict[str, Any] = {
        "job": name, "seed": seed, "model": fit.name, "loo_error": fit.loo_error,
        "measured": len(exploration.measurements), "stopped": exploration.stopped,
        "testbed_slot_hours": exploration.slot_seconds / 3600,
        # How far the measured MSTs are off the truth (standard deviation over the configurations).
        "mst_error_sd": float(np.std([m.mst / model.capacity(m.slots) - 1 for m in exploration.stable])),
        **{f"error_at_{n}": fit.at(n) / model.capacity(n) - 1 for n in FAR},
        "rate": rate, "answer_slots": answer.slots, "fewest_slots": static_parallelism(model, rate, LARGEST_ANSWER),
        "wall_s": time.perf_counter() - started,
    }
    curve, error = planned_curve(exploration, STEP_MAX_PARALLELISM)
    row["planned_curve"] = format_planned_capacity(curve)
    row["planned_error"] = error
    if answer.slots is not None:
        check = ModelTestbed(model, rate_noise=NOISE, seed=10_000 + seed, measure_s=600.0)
        row["sustained"] = check.run(answer.slots, rate).sustained
        row["capacity_oversize"] = model.capacity(answer.slots) / rate - 1
        row["slot_oversize"] = answer.slots / row["fewest_slots"] - 1
        # Against the fewest slots that truly carry the rate with the plan's own headroom (110 %): what a
        # perfect model would answer, so this is the oversize the model's errors add.
        row["fewest_with_headroom"] = static_parallelism(model, HEADROOM * rate, LARGEST_ANSWER)
        row["headroom_oversize"] = answer.slots / row["fewest_with_headroom"] - 1
    truth = model.capacity(answer.slots or answer.best_slots)
    row.update(interval=(answer.low, answer.high), truth_in_interval=answer.low <= truth <= answer.high,
               models_disagree=answer.models_disagree)
    return row


STEP_SLOTS = (3.0, 6.0)  # the step's peak: so many times one slot's capacity (a quarter of it before the step)
STEP_MAX_PARALLELISM = 12


def first_decisions(model: JobModel, seed: int, planned: str, error: float, slots: float) -> dict[str, Any]:
    """The step-up trace on a new job at 1 slot, with the planned capacity given (or "")."""
    peak = slots * model.capacity(1)
    trace = load_trace("step-up", hours=2.0, peak=peak, window_s=WINDOW_S, regime="real-time", seed=seed)
    config = JobConfig(max_parallelism=STEP_MAX_PARALLELISM, planned_capacity=planned, planned_capacity_error=error)
    runner = PolicyRunner(make_policy("default"), config)
    run = simulate(trace, model, runner, config, 1, config.backlog_target_s, None, seed, NOISE)
    t = np.asarray(run.timeline.t)
    p = np.asarray(run.timeline.parallelism)
    after = t > 3600
    ups = [int(b) for a, b, late in zip(p[:-1], p[1:], after[1:], strict=True) if late and b > a]
    backlog = np.asarray(run.timeline.backlog)[after]
    return {"scale_ups_after_step": len(ups), "first_target": ups[0] if ups else None,
            "held": int(p[-1]), "peak_backlog": float(backlog.max()),
            "fewest_slots": static_parallelism(model, peak, STEP_MAX_PARALLELISM),
            "seconds_beyond_target": float(WINDOW_S * np.sum(backlog > config.backlog_target_s * peak))}


def _pct(values: list[float]) -> str:
    ordered = sorted(values, key=abs)
    return f"{100 * ordered[len(ordered) // 2]:+.1f} / {100 * ordered[-1]:+.1f}"


def first_decision_rows(jobs: dict[str, JobModel], rows: list[dict[str, Any]], seeds: int) -> list[dict[str, Any]]:
    """Each job, seed and step size: the new job's first decisions without and with its plan."""
    step_rows = []
    for (name, model), seed, size in itertools.product(jobs.items(), range(seeds), STEP_SLOTS):
        plan = next(r for r in rows if r["job"] == name and r["seed"] == seed)
        for arm, curve in (("without", ""), ("with", plan["planned_curve"])):
            step_rows.append({"job": name, "seed": seed, "step_slots": size, "plan": arm}
                             | first_decisions(model, seed, curve, plan["planned_error"], size))
    return step_rows


def print_first_decisions(console: Console, jobs: dict[str, JobModel], step_rows: list[dict[str, Any]],
                          seeds: int) -> None:
    step = table(f"a new job at 1 slot, its load x4 after an hour (to 3 or 6 slots' worth at one slot's rate), "
                 f"without and with its plan; {seeds} seeds; median / worst", "job", "to", "plan",
                 "scale-ups after the step", "first scale-up to", "held at (fewest)", "peak backlog (records)",
                 "seconds beyond the target")
    for name, size, arm in itertools.product(jobs, STEP_SLOTS, ("without", "with")):
        mine = [r for r in step_rows if r["job"] == name and r["plan"] == arm and r["step_slots"] == size]

        def spread(key: str, mine: list[dict[str, Any]] = mine) -> str:
            values = sorted(float(r[key] or 0) for r in mine)
            return f"{values[len(values) // 2]:,.0f} / {values[-1]:,.0f}"

        step.add_row(name, f"{size:g}", arm, spread("scale_ups_after_step"),
                     ", ".join(str(r["first_target"]) for r in mine),
                     f"{', '.join(str(r['held']) for r in mine)} ({mine[0]['fewest_slots']})",
                     spread("peak_backlog"), spread("seconds_beyond_target"))
    console.print(step)


@app.command()
def main(
    seeds: Annotated[int, typer.Option(help="Noise seeds per job.")] = 5,
    max_slots: Annotated[int, typer.Option(help="The testbed's largest configuration.")] = 8,
    measure_s: Annotated[float, typer.Option(help="Seconds measured per injected rate.")] = 300.0,
    sensibility: Annotated[float, typer.Option(help="The dichotomy stops when its next rate is this close to "
                                                     "the last (relative).")] = SENSIBILITY,
    min_after_corners: Annotated[int, typer.Option(help="Configurations measured beyond the two corners before "
                                                        "the error rule may stop the exploration (the "
                                                        "largest: every candidate).")] = MIN_AFTER_CORNERS,
    first_decisions: Annotated[bool, typer.Option(help="Also run the new job's first decisions without and with "
                                                       "its plan.")] = True,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "capacity_plan.json",
) -> None:
    console = Console(width=max(150, Console().width))
    jobs = {**scaling_truths(), "demo": demo_job_model().model()}
    rows = [one_plan(name, model, seed, max_slots, measure_s, sensibility, min_after_corners)
            for name, model in jobs.items() for seed in range(seeds)]
    out = table(f"capacity plans trained on 1-{max_slots} slots, {seeds} seeds per job, noise {NOISE:.1%} per 10-s "
                "window; error median / worst (by size)", "job", "models chosen", "error at 32", "error at 64",
                "answer for MST(32): slots", "sustained", "capacity oversize", "slots over a perfect plan's",
                "truth in interval", "flagged", "testbed slot-hours")
    summaries = {}
    for name in jobs:
        mine = [r for r in rows if r["job"] == name]
        answered = [r for r in mine if r["answer_slots"] is not None]
        chosen = ", ".join(sorted({r["model"] for r in mine}))
        summaries[name] = {
            "models": chosen,
            **{f"error_at_{n}": {"median_abs": sorted(abs(r[f"error_at_{n}"]) for r in mine)[len(mine) // 2],
                                 "worst_abs": max(abs(r[f"error_at_{n}"]) for r in mine)} for n in FAR},
            "sustained": sum(bool(r.get("sustained")) for r in mine), "plans": len(mine),
            "worst_capacity_oversize": max((r["capacity_oversize"] for r in answered), default=None),
            "worst_headroom_oversize": max((r["headroom_oversize"] for r in answered), default=None),
            "truth_in_interval": sum(r["truth_in_interval"] for r in mine),
            "models_disagree": sum(r["models_disagree"] for r in mine),
            "median_mst_error_sd": float(np.median([r["mst_error_sd"] for r in mine])),
        }
        out.add_row(
            name, chosen, _pct([r["error_at_32"] for r in mine]), _pct([r["error_at_64"] for r in mine]),
            f"{min(r['answer_slots'] or 0 for r in mine)}-{max(r['answer_slots'] or 0 for r in mine)} "
            f"(fewest {mine[0]['fewest_slots']})",
            f"{summaries[name]['sustained']} of {len(mine)}",
            _pct([r["capacity_oversize"] for r in answered]) if answered else "-",
            f"{_pct([r['headroom_oversize'] for r in answered])} (perfect: {mine[0]['fewest_with_headroom']})"
            if answered else "-",
            f"{sum(r['truth_in_interval'] for r in mine)} of {len(mine)}",
            f"{sum(r['models_disagree'] for r in mine)} of {len(mine)}",
            f"{sorted(r['testbed_slot_hours'] for r in mine)[len(mine) // 2]:.1f}",
        )
    console.print(out)
    step_rows: list[dict[str, Any]] = []
    if first_decisions:
        step_rows = first_decision_rows(jobs, rows, seeds)
        print_first_decisions(console, jobs, step_rows, seeds)
    write_result(output, {
        "first_decisions": step_rows, "summaries": summaries, "rows": rows,
        "settings": {"seeds": seeds, "max_slots": max_slots, "measure_s": measure_s, "settle_s": 60.0,
                     "start_rate": START_RATE, "sensibility": sensibility, "min_after_corners": min_after_corners,
                     "noise": NOISE},
    }, ("capacity/scaling.py", "capacity/mst.py", "capacity/explore.py", "capacity/testbed.py",
        "evaluation/jobmodel.py"), console)

if __name__ == "__main__":
    app()

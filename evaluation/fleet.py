"""A fleet on one cluster: N jobs replayed side by side on one clock, sharing a budget of slots.

  autoscaler evaluate --fleet 8                 8 jobs on the shared traces, a budget of 60 % of their peaks
  autoscaler evaluate --fleet 8 --budget 40 --trace wiki --trace-file mine.csv

Each job is the evaluation's job (`evaluation.suite`): the same job model, configuration, noise law and
planner, on its own trace (the traces given, in turn) shifted by `i / N` of a day (of the trace, or of
its length where shorter), so the jobs' peaks fall at different times, with its own noise seed. The
jobs run in the one simulator (`evaluation.simulator.JobSim`), window by window, on one in-memory
knowledge base, so the plan step's slot sharing works across them as it does live. Arms, on the same
loads and noise:
- `fleet`: the jobs name a cluster of `budget` slots; the fleet step (`plan.fleet`) allocates them;
- `quota`: a slot quota of `budget` (AUTOSCALER_SLOT_QUOTA): a scale-up takes what is free, first come;
- `alone`: no budget; each job planned as if the cluster were its own (its overruns counted).

Measures: the fleet's slot-seconds; each job's time beyond its backlog target; budget overruns (the
seconds in which the slots held, a rescale in flight holding its larger side, exceed the budget);
starvation (the seconds a job runs below what its arrivals need, in runs of 60 s or more, while
another job holds more than its own need); and a lower bound: the sum of the jobs' oracles (each on
its own load and noise). A price on slots does not change an oracle whose target is a constraint and
whose cost is its slots (the same schedule at any price), so the priced bound is the sum itself; the
seconds in which the oracles together exceed the budget say whether it binds them too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from contracts.fleet import ClusterConfig
from contracts.settings import Settings
from evaluation.forecasts import forecast_stream, one_blas_thread
from evaluation.jobmodel import JobModel
from evaluation.simulator import REPORTS_PER_WINDOW, WINDOW_S, JobSim, PolicyRunner, rate_factors, static_parallelism
from evaluation.suite import EvalSettings, capacities_of, eval_config, oracle_for, start_parallelism
from evaluation.traces import SHARED_TRACES, Regime, Trace, replay, resolve
from knowledge.memory import MemoryKnowledge, run_now
from plan.fleet import join, weighted_share
from plan.registry import make_policy

ARMS = ("fleet", "quota", "alone")
CLUSTER = "fleet"
BUDGET_SHARE = 0.6  # the default budget: this share of the sum of the jobs' peak slots
STARVED_AFTER_S = 60.0
DAY_S = 86_400.0


@dataclass(frozen=True)
class FleetCase:
    """One fleet: `jobs` jobs on `traces` (in turn), a budget (None: `budget_share` of their peak slots)."""

    jobs: int = 8
    budget: int | None = None
    budget_share: float = BUDGET_SHARE
    traces: tuple[str, ...] = SHARED_TRACES
    regime: Regime = "compressed"
    policy: str = "default"
    weights: tuple[float, ...] = (1.0,)  # the jobs' weights, in turn


def shifted_trace(name: str, i: int, n: int, settings: EvalSettings, regime: Regime, seed: int) -> Trace:
    """Job i's load: the trace shifted by i / n of a day of its rows (of its length, where shorter)."""
    series = resolve(name, settings.hours, settings.fill_gaps)
    cycle = max(1, min(len(series.values), round(DAY_S / series.row_s)))
    offset = (i * cycle) // n
    shifted = dataclasses.replace(series, values=np.roll(series.values, -offset),
                                  source=f"{series.source}, shifted by {offset} rows")
    return replay(shifted, hours=settings.hours, rate=settings.peak, scaling=settings.scaling, regime=regime,
                  window_s=WINDOW_S, seed=seed)


@dataclass
class FleetJob:
    name: str
    trace: Trace
    factors: np.ndarray
    start: int
    peak_slots: int


def fleet_jobs(case: FleetCase, settings: EvalSettings, model: JobModel, seed: int) -> list[FleetJob]:
    out = []
    for i in range(case.jobs):
        trace = shifted_trace(case.traces[i % len(case.traces)], i, case.jobs, settings, case.regime, seed)
        factors = rate_factors(len(trace.rates), seed * 1000 + i, settings.noise)
        out.append(FleetJob(f"job-{i}", trace, factors, start_parallelism(model, trace.rates, settings.max_parallelism),
                            static_parallelism(model, float(trace.rates.max()), settings.max_parallelism)))
    return out


def run_arm(arm: str, jobs: list[FleetJob], budget: int, case: FleetCase, settings: EvalSettings, model: JobModel,
            forecasts: dict[str, Any]) -> dict[str, Any]:
    """The jobs side by side under one arm (see the module docstring); the arm's measures."""
    started = time.perf_counter()
    knowledge = MemoryKnowledge(Settings())
    if arm == "fleet":
        run_now(knowledge.register_cluster(ClusterConfig(name=CLUSTER, workers=budget, slots_per_worker=1)))
        for job in jobs:  # what each job runs as it joins
            run_now(knowledge.update_fleet(CLUSTER, join(job.name, job.start, CLUSTER)))
    config = eval_config(settings).model_copy(update={"policy": case.policy,
                                                      "cluster": CLUSTER if arm == "fleet" else ""})
    quota = budget if arm == "quota" else None
    sims = []
    for i, job in enumerate(jobs):
        weighted = config.model_copy(update={"weight": case.weights[i % len(case.weights)]})
        runner = PolicyRunner(make_policy(case.policy), weighted, job.name, quota=quota, knowledge=knowledge)
        if quota is not None:
            run_now(knowledge.reserve_slots(job.name, job.start, job.start, quota, commit=True))
        sims.append(JobSim(job.trace, model, runner, weighted, job.start, settings.backlog_target_s,
                           forecasts.get(job.name), factors=job.factors, job_id=job.name))
    windows = min(len(job.trace.rates) for job in jobs)
    held = np.zeros((windows, len(jobs)), dtype=int)
    for i in range(windows):
        for k, sim in enumerate(sims):
            sim.step(i)
            held[i, k] = sim.holding
    runs = [sim.result() for sim in sims]
    needs = np.array([[static_parallelism(model, float(r), settings.max_parallelism) for r in job.trace.rates[:windows]]
                      for job in jobs]).T
    parallelism = np.array([run.timeline.parallelism[:windows] for run in runs]).T
    late = np.array([np.asarray(run.timeline.backlog[:windows]) > settings.backlog_target_s
                     * np.asarray(run.timeline.arrival[:windows]) for run in runs]).T
    return {
        "arm": arm,
        "slot_seconds": round(sum(run.slot_seconds for run in runs), 1),
        "beyond_target_s": [run.beyond_target_s for run in runs],
        "worst_beyond_target_s": max(run.beyond_target_s for run in runs),
        "actions": sum(run.actions for run in runs),
        "overrun_s": WINDOW_S * int(np.count_nonzero(held.sum(axis=1) > budget)),
        "peak_held": int(held.sum(axis=1).max()),
        "starved_s": starvation_s(parallelism, needs, late),
        "fleet_budget_decisions": sum(sim.policy.reasons.get("fleet_budget", 0) for sim in sims
                                      if isinstance(sim.policy, PolicyRunner)),
        "seconds": round(time.perf_counter() - started, 1),
    }


def starvation_s(parallelism: np.ndarray, needs: np.ndarray, late: np.ndarray, window_s: float = WINDOW_S,
                 after_s: float = STARVED_AFTER_S) -> float:
    """Seconds (arrays: windows of `window_s` x jobs) a job starves: it runs below what its arrivals need while
    its backlog is beyond its target (`late`), for `after_s` or more in a row, while another job holds more
    than its own need (only the windows of such runs count). A job below its need within its target is not
    starving: the planner lets a backlog grow toward the target where that costs less."""
    surplus = parallelism > needs
    others_surplus = surplus.sum(axis=1, keepdims=True) - surplus > 0
    starving = (parallelism < needs) & late & others_surplus
    run_windows = math.ceil(after_s / window_s - 1e-9)
    total = 0
    for column in starving.T:
        length = 0
        for value in [*column, False]:
            if value:
                length += 1
            else:
                total += length if length >= run_windows else 0
                length = 0
    return window_s * total


def evaluate_fleet(case: FleetCase, settings: EvalSettings, seed: int, arms: tuple[str, ...] = ARMS
                   ) -> dict[str, Any]:
    """One fleet with one noise seed: every arm on the same loads and noise, and the jobs' oracles."""
    started = time.perf_counter()
    one_blas_thread()
    model = settings.job().model()
    jobs = fleet_jobs(case, settings, model, seed)
    budget = case.budget if case.budget is not None else math.floor(case.budget_share * sum(j.peak_slots for j in jobs))
    if sum(j.start for j in jobs) > budget:  # the jobs start within the budget, sharing it as the fleet step would
        starts = weighted_share({j.name: 1 for j in jobs}, {j.name: j.start for j in jobs},
                                {j.name: 1.0 for j in jobs}, budget)
        jobs = [dataclasses.replace(j, start=starts[j.name]) for j in jobs]
    config = eval_config(settings)
    forecasts = {job.name: forecast_stream(job.trace, config) for job in jobs}
    capacities = capacities_of(model, settings)
    oracles = [oracle_for(job.trace, model, job.factors, job.start, settings, capacities, relaxation=False)[0]
               for job in jobs]
    windows = min(len(job.trace.rates) for job in jobs)
    together = np.sum([o.parallelism[::REPORTS_PER_WINDOW][:windows] for o in oracles], axis=0)
    bound = sum(o.slot_seconds for o in oracles)
    results = [run_arm(arm, jobs, budget, case, settings, model, forecasts) for arm in arms]
    for r in results:
        r["vs_bound"] = round(r["slot_seconds"] / bound, 4)
    return {
        "seed": seed, "jobs": [{"name": j.name, "trace": j.trace.description, "peak_slots": j.peak_slots,
                                "start": j.start, "weight": case.weights[i % len(case.weights)]}
                               for i, j in enumerate(jobs)],
        "budget": budget, "sum_of_peaks": sum(j.peak_slots for j in jobs),
        "bound": {"slot_seconds": round(bound, 1), "over_budget_s": WINDOW_S * int(np.count_nonzero(together > budget)),
                  "peak_slots": int(together.max()), "all_feasible": all(o.feasible for o in oracles)},
        "arms": results, "seconds": round(time.perf_counter() - started, 1),
    }


def evaluate_fleets(case: FleetCase, settings: EvalSettings, workers: int) -> list[dict[str, Any]]:
    """`settings.seeds` fleets (seeds from `settings.first_seed`), in `workers` processes."""
    seeds = list(range(settings.first_seed, settings.first_seed + settings.seeds))
    if workers <= 1:
        return [evaluate_fleet(case, settings, seed) for seed in seeds]
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        return list(pool.map(evaluate_fleet, [case] * len(seeds), [settings] * len(seeds), seeds))


def summarize_fleets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm: the median and worst over the seeds."""
    out = []
    for arm in [r["arm"] for r in results[0]["arms"]]:
        rows = [next(a for a in r["arms"] if a["arm"] == arm) for r in results]
        out.append({"arm": arm} | {
            f"{key}_{how}": round(float(fn([row[key] for row in rows])), 4)
            for key in ("vs_bound", "worst_beyond_target_s", "overrun_s", "starved_s", "actions")
            for how, fn in (("median", np.median), ("worst", np.max))})
    return out


def run_fleet_evaluation(console: Console, case: FleetCase, settings: EvalSettings, workers: int, json_out: Path
                         ) -> list[dict[str, Any]]:
    """`autoscaler evaluate --fleet N`: every seed's fleet, a table of the arms (median and worst over the seeds)
    and the JSON."""
    started = time.perf_counter()
    results = evaluate_fleets(case, settings, workers)
    summary = summarize_fleets(results)
    table = Table(title=f"{case.jobs} jobs on one cluster, {settings.seeds} seeds ({case.regime}); budget "
                        f"{', '.join(sorted({str(r['budget']) for r in results}))} slots of "
                        f"{', '.join(sorted({str(r['sum_of_peaks']) for r in results}))} peak")
    for column in ("arm", "slot-s / bound", "worst job beyond target (s)", "overrun (s)", "starved (s)", "actions"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for row in summary:
        table.add_row(row["arm"], *(f"{row[k + '_median']:g} ({row[k + '_worst']:g})" for k in
                                    ("vs_bound", "worst_beyond_target_s", "overrun_s", "starved_s", "actions")))
    console.print(table)
    over = [r["bound"]["over_budget_s"] for r in results]
    console.print(f"median (worst) over the seeds. Bound: the sum of the jobs' oracles; together they exceed the "
                  f"budget {np.median(over):g} s (worst {max(over):g} s) of {settings.hours:g} h.")
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({"case": dataclasses.asdict(case), "settings": {
        **settings.__dict__, "regimes": list(settings.regimes)}, "summary": summary, "fleets": results,
        "wall_s": round(time.perf_counter() - started, 1), "workers": workers}, indent=1))
    console.print(f"wrote {json_out} in {time.perf_counter() - started:.0f} s on {workers} workers")
    return results

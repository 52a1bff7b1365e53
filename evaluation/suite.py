"""The evaluation suite: every policy on every trace, beside static provisioning and a clairvoyant oracle.

  autoscaler evaluate                                 every policy, every trace, 6 h of load each
  autoscaler evaluate --policy default --policy flink --trace wiki
  autoscaler evaluate --live --trace sine             (see evaluation.live)
  autoscaler evaluate --policy default --explain-gap  where its cost above the oracle's comes from (evaluation.gap)

Each policy of the registry (`plan.registry`) replays each trace in the one simulator
(`evaluation.simulator`) through our monitor, analyze and plan code, on the job model calibrated
from the live demo job (`evaluation.jobmodel`). The oracle (`evaluation.oracle`) knows the whole
load. Writes a table (stdout), JSON, a markdown table and one PNG per trace (`evaluation.report`).
See docs/results.md for the current numbers and the calibration.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from statistics import NormalDist
from typing import Any

import numpy as np

from contracts.backends import BackendKind
from contracts.jobs import JobConfig
from evaluation.forecasts import FORECAST_STEP_S, forecast_stream, one_blas_thread
from evaluation.gap import GapDecomposition, gap_of_run
from evaluation.jobmodel import JobModel
from evaluation.model_files import JobModelFile, load_job_model
from evaluation.noise_bound import NoiseAwareBound, noise_aware_bound
from evaluation.oracle import oracle_with_restarts, oracle_without_restarts
from evaluation.simulator import (
    REPORTS_PER_WINDOW,
    WINDOW_S,
    PolicyRunner,
    Timeline,
    rate_factors,
    simulate,
    static_parallelism,
)
from evaluation.traces import REGIMES, GapFill, Regime, Scaling, Trace, load_trace, resolve
from plan.policies.default import CostPlanner
from plan.registry import POLICIES, make_policy, policy_class

# Every policy of the registry, in the order the tables show them: the baselines, then ours.
EVALUATED = ("static", "threshold", "ds2", "flink", "daedalus", "hybrid", "reactive", "default")
assert set(EVALUATED) == set(POLICIES), "every registered policy is evaluated"
SCALED_BASELINES = ("threshold", "flink")  # baselines with time constants of their own
# The noise-aware bound keeps the target with the probability the default planner's capacity quantile aims at.
BOUND_PROBABILITY = round(NormalDist().cdf(CostPlanner().capacity_z), 2)


@dataclass(frozen=True)
class EvalSettings:
    hours: float = 6.0
    peak: float = 1400.0  # each trace is scaled by one factor so that its peak (or mean) is this rate
    scaling: Scaling = "peak"
    max_parallelism: int = 12
    backlog_target_s: float = 60.0
    seeds: int = 5
    first_seed: int = 0
    rate_noise: float | None = None  # None: the job model's
    job_model: str | None = None  # a job-model file (`autoscaler calibrate`); None: the demo job's
    regimes: tuple[Regime, ...] = REGIMES
    backend: BackendKind = BackendKind.RESTART  # how every policy's job (and the oracle's) is rescaled
    fill_gaps: GapFill | None = None  # a trace file's missing rows: refused (None), or filled
    noise_bound: bool = True  # also the noise-aware bound (`evaluation.noise_bound`): about 7 oracle searches

    def job(self) -> JobModelFile:
        return load_job_model(self.job_model)

    @property
    def noise(self) -> float:
        return self.rate_noise if self.rate_noise is not None else self.job().rate_noise


def eval_config(settings: EvalSettings) -> JobConfig:
    """The default job configuration with the evaluation's backlog target, and the forecaster's first
    fit after 30 points (30 minutes at one a minute)."""
    return JobConfig(max_parallelism=settings.max_parallelism, forecast_min_points=30,
                     backlog_target_s=settings.backlog_target_s, scaling_backend=settings.backend)


def baseline_parameters(name: str, compression: float) -> dict[str, float]:
    """A baseline's own time constants (its fields in seconds) shrunk by the time compression, so that it
    sees as much of the load's shape per decision as it would in real time."""
    if name not in SCALED_BASELINES or compression <= 1:
        return {}
    cls = policy_class(name)
    return {f.name: f.default / compression for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.name.endswith("_s") and isinstance(f.default, float)}


def start_parallelism(model: JobModel, rates: np.ndarray, max_parallelism: int) -> int:
    """Where every policy and the oracle start: the fewest slots that carry the first 10 minutes."""
    return static_parallelism(model, float(rates[: max(1, round(600 / WINDOW_S))].max()), max_parallelism)


def oracle_arguments(trace: Trace, model: JobModel, start: int, settings: EvalSettings
                     ) -> tuple[np.ndarray, dict[str, Any]]:
    """The oracle's load and arguments in the simulator's own terms, noise aside: half-window steps (the
    reporter's interval), a decision at each window's end from the first window on, the rule checked at
    each window's end, the pause of each direction (a restart, or in place a scale-down's hold), an in-place
    scale-up's time at the old capacity, and the replay the simulator charges (none: decisions fall on
    checkpoint boundaries, and in place nothing is replayed)."""
    half = REPORTS_PER_WINDOW
    args: dict[str, Any] = {
        "dt": trace.window_s / half, "restart_downtime_s": model.downtime(1, 2),
        "downtime_down_s": model.downtime(2, 1), "ramp_s": model.ramp(1, 2), "replay_records": 0.0,
        "backlog_target_s": settings.backlog_target_s, "grace_s": 0.0, "decision_s": trace.window_s,
        "initial_parallelism": start, "check_every": half, "first_decision_s": trace.window_s,
    }
    return np.repeat(trace.rates, half), args


def capacities_of(model: JobModel, settings: EvalSettings) -> np.ndarray:
    """The job model's capacity (records/s) at each parallelism 0..max, as the oracle and the bound take it."""
    return np.array([0.0, *(model.capacity(p) for p in range(1, settings.max_parallelism + 1))])


def oracle_for(trace: Trace, model: JobModel, factors: np.ndarray, start: int, settings: EvalSettings,
               capacities: np.ndarray, relaxation: bool = True) -> tuple[Any, Any]:
    """The oracle and its free-rescale relaxation (`oracle_arguments`; None without `relaxation`), with the
    same noise as the policies."""
    rates, args = oracle_arguments(trace, model, start, settings)
    noise = np.repeat(factors, REPORTS_PER_WINDOW)
    return (oracle_with_restarts(rates, capacities, rate_factors=noise, **args),
            oracle_without_restarts(rates, capacities, rate_factors=noise, **args) if relaxation else None)


def bound_for(trace: Trace, model: JobModel, start: int, settings: EvalSettings, capacities: np.ndarray,
              seed: int) -> NoiseAwareBound:
    """The noise-aware bound on the oracle's terms (`oracle_arguments`), knowing the noise's law only."""
    rates, args = oracle_arguments(trace, model, start, settings)
    return noise_aware_bound(rates, capacities, sigma=settings.noise, probability=BOUND_PROBABILITY, seed=seed,
                             **args)


def evaluate_case(name: str, regime: Regime, seed: int, policies: Sequence[str], settings: EvalSettings
                  ) -> dict[str, Any]:
    """One trace in one regime with one noise seed: every policy and the oracle on the same load and noise."""
    started = time.perf_counter()
    forecasting = [p for p in policies if policy_class(p).needs_forecast]
    if forecasting:
        one_blas_thread()
    model = settings.job().model(in_place=settings.backend is BackendKind.IN_PLACE)
    trace = load_trace(name, settings.hours, settings.peak, WINDOW_S, regime, seed, settings.scaling,
                       settings.fill_gaps)
    config = eval_config(settings)
    noise = settings.noise  # read from the job-model file once per case
    factors = rate_factors(len(trace.rates), seed, noise)
    static_p = static_parallelism(model, float(trace.rates.max()), settings.max_parallelism)
    start = start_parallelism(model, trace.rates, settings.max_parallelism)
    forecasts = forecast_stream(trace, config) if forecasting else None
    capacities = capacities_of(model, settings)
    oracle, loose = oracle_for(trace, model, factors, start, settings, capacities)
    bound = bound_for(trace, model, start, settings, capacities, seed) if settings.noise_bound else None
    runs = []
    gaps: list[GapDecomposition] = []
    for policy_name in policies:
        policy = make_policy(policy_name, **baseline_parameters(policy_name, trace.compression))
        runner = PolicyRunner(policy, config.model_copy(update={"policy": policy_name}))
        first = static_p if policy_name == "static" else start
        runs.append(simulate(trace, model, runner, config, first, settings.backlog_target_s,
                             forecasts if policy_name in forecasting else None, seed, noise,
                             factors=factors))
        gaps.append(gap_of_run(runs[-1], runner.decided, oracle.parallelism[::REPORTS_PER_WINDOW], oracle.slot_seconds))
    static_cost = static_p * trace.duration_s
    rows = [_renamed(run.summary()) | {"restarts": run.actions,
                             "vs_static": round(run.slot_seconds / static_cost, 4),
                             "vs_oracle": round(run.slot_seconds / oracle.slot_seconds, 4)}
            | ({"vs_noise_bound": round(run.slot_seconds / bound.slot_seconds, 4)} if bound else {}) for run in runs]
    for row, gap in zip(rows, gaps, strict=True):
        row["gap"] = gap.as_dict()  # on every window of the run (`evaluation.gap`)
    return {
        "trace": name, "regime": regime, "seed": seed, "description": trace.description, "sha256": trace.sha256,
        "compression": trace.compression, "windows": len(trace.rates),
        "peak_rate": round(float(trace.rates.max()), 1), "mean_rate": round(float(trace.rates.mean()), 1),
        "start_parallelism": start, "static_parallelism": static_p, "static_slot_seconds": static_cost,
        "oracle": {"slot_seconds": round(oracle.slot_seconds, 1), "actions": oracle.rescales,
                   "feasible": oracle.feasible, "seconds_beyond_target": oracle.violation_s,
                   "certified_optimal": oracle.certified_optimal,
                   "gap_slot_seconds": round(oracle.gap_slot_seconds, 1),
                   "vs_static": round(oracle.slot_seconds / static_cost, 4),
                   "peak_backlog": round(float(oracle.backlog.max(initial=0.0)), 1),
                   "without_restarts_slot_seconds": round(loose.slot_seconds, 1),
                   "schedule": [int(x) for x in oracle.parallelism[::REPORTS_PER_WINDOW]]},
        "noise_bound": None if bound is None else {
            "slot_seconds": round(bound.slot_seconds, 1), "actions": bound.rescales, "margin": round(bound.margin, 4),
            "accepted": bound.accepted, "probability": bound.probability, "scenarios": bound.scenarios,
            "beyond_target_s_quantile": bound.beyond_target_s,
            "vs_oracle": round(bound.slot_seconds / oracle.slot_seconds, 4)},
        "forecast": None if forecasts is None else {
            "mean_wape": round(float(np.mean(forecasts.wapes)), 4) if forecasts.wapes else None,
            "refits": forecasts.refits, "seconds": round(forecasts.seconds, 2),
            "arima_share": round(forecasts.methods.count("arima") / max(1, len(forecasts.methods)), 3),
        },
        "runs": rows,
        "timelines": {run.policy: _thin(run.timeline) for run in runs}
        | {"oracle": {"t": list(np.arange(1, len(trace.rates) + 1) * trace.window_s),
                      "parallelism": [int(x) for x in oracle.parallelism[::REPORTS_PER_WINDOW]]}},
        "seconds": round(time.perf_counter() - started, 2),
    }


def summarize(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace and regime, each policy's median and worst case over the seeds."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case in cases:
        groups.setdefault((case["trace"], case["regime"]), []).append(case)
    out = []
    for (trace, regime), group in groups.items():
        policies = [row["policy"] for row in group[0]["runs"]]
        rows = []
        for policy in policies:
            got = [next(r for r in case["runs"] if r["policy"] == policy) for case in group]
            rows.append({
                "policy": policy,
                "vs_oracle_median": _median([r["vs_oracle"] for r in got]),
                "vs_oracle_worst": max(r["vs_oracle"] for r in got),
                "vs_static_median": _median([r["vs_static"] for r in got]),
                "beyond_target_s_median": _median([r["seconds_beyond_target"] for r in got]),
                "beyond_target_s_worst": max(r["seconds_beyond_target"] for r in got),
                "actions_median": _median([r["actions"] for r in got]),
                "actions_worst": max(r["actions"] for r in got),
                "peak_backlog_worst": max(r["peak_backlog"] for r in got),
            } | ({"vs_noise_bound_median": _median([r["vs_noise_bound"] for r in got]),
                  "vs_noise_bound_worst": max(r["vs_noise_bound"] for r in got)} if "vs_noise_bound" in got[0] else {}))
        oracle = [case["oracle"] for case in group]
        out.append({
            "trace": trace, "regime": regime, "seeds": [case["seed"] for case in group],
            "description": group[0]["description"], "duration_s": group[0]["windows"] * WINDOW_S,
            "static_parallelism": group[0]["static_parallelism"], "start_parallelism": group[0]["start_parallelism"],
            "oracle_vs_static_median": _median([o["vs_static"] for o in oracle]),
            "oracle_actions_median": _median([o["actions"] for o in oracle]),
            "oracle_all_feasible": all(o["feasible"] for o in oracle),
            "oracle_all_certified": all(o["certified_optimal"] for o in oracle),
            "noise_bound_vs_oracle_median": _median([c["noise_bound"]["vs_oracle"] for c in group])
            if all(c.get("noise_bound") for c in group) else None,
            "rows": rows,
        })
    return out


def _renamed(row: dict[str, Any]) -> dict[str, Any]:
    """A run's figures under the names the JSON uses for the oracle's too (`seconds_beyond_target`)."""
    return {("seconds_beyond_target" if k == "beyond_target_s" else k): v for k, v in row.items()}


def _median(values: list[float]) -> float:
    return round(float(np.median(values)), 4)


def _thin(timeline: Timeline, every: int = 3) -> dict[str, list[float]]:
    """Every `every`-th window, enough for a plot of hours."""
    return {k: [round(float(x), 2) for x in v[::every]] for k, v in timeline.__dict__.items() if isinstance(v, list)}


def cases_of(traces: Sequence[str], settings: EvalSettings) -> list[tuple[str, Regime, int]]:
    """Every (trace, regime, seed) to run. A trace recorded at 1 s rows plays the same in both regimes:
    it runs once, as real time."""
    seeds = range(settings.first_seed, settings.first_seed + settings.seeds)
    out = []
    for name in traces:
        series = resolve(name, settings.hours, settings.fill_gaps)
        regimes = settings.regimes if series.row_s > WINDOW_S else ("real-time",)
        out += [(name, regime, seed) for regime in regimes for seed in seeds]
    return out


def evaluate_all(traces: Sequence[str], policies: Sequence[str], settings: EvalSettings, workers: int,
                 on_done: Callable[[tuple[str, str, int]], None] = lambda _: None) -> list[dict[str, Any]]:
    """Every case (see `cases_of`), in `workers` processes; the cases in order."""
    cases = cases_of(traces, settings)
    if workers <= 1 or len(cases) <= 1:
        results = []
        for case in cases:
            results.append(evaluate_case(*case, policies, settings))
            on_done(case)
        return results
    done: dict[tuple[str, Regime, int], dict[str, Any]] = {}
    # Spawned workers: the parent may hold threads (rich's progress bar), which fork would copy.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(evaluate_case, *case, list(policies), settings): case for case in cases}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            on_done(futures[future])
    return [done[case] for case in cases]


def calibration(settings: EvalSettings) -> dict[str, Any]:
    """The job model (with how it was measured), the noise used and the replay's granularity, written
    beside every result."""
    return {**settings.job().model_dump(mode="json"), "job_model_file": settings.job_model or "built-in demo",
            "rate_noise_used": settings.noise, "window_s": WINDOW_S, "reports_per_window": REPORTS_PER_WINDOW,
            "forecast_step_s": FORECAST_STEP_S}

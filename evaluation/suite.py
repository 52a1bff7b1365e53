"""The evaluation suite: every policy on every trace, beside the baselines and a clairvoyant oracle.

  autoscaler bench evaluate                       every policy, every trace, 6 h of load each
  autoscaler bench evaluate --policy ours --policy flink --trace wiki
  autoscaler bench evaluate --live --trace sine   (see evaluation.live)

Each run replays a trace into the job model (`evaluation.jobmodel`, calibrated from the live demo job),
one metric window at a time. The model's `MetricReport`s go through the monitor's window folding
(`monitor.windows`), analyze's true rates (`analyze.true_rates`), and for the proactive policies
analyze's capacity model, recovery detector and forecaster (`analyze.proactive`, `analyze.forecast`),
then to the policy. Ours and Daedalus are `plan.controls.guarded_plan`, the code the plan agent runs.

Writes a table (stdout), `bench/results/evaluate.json` and one PNG per trace under
`bench/results/evaluate/`. See docs/results.md for the current numbers and the calibration.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from analyze.forecast import ForecastState, fit_model, install_model, step
from analyze.proactive import forecast_config, forecast_view, learn, new_learned
from analyze.true_rates import analyze_window
from contracts.jobs import JobConfig
from contracts.jobs import Policy as JobPolicy
from contracts.messages import Action, Analysis, ForecastView
from evaluation.baselines import OurPolicy, ThresholdPolicy
from evaluation.convergence import experiment
from evaluation.flink_policy import FlinkStylePolicy
from evaluation.jobmodel import JobModel, JobState, Operator, advance, report, rescale
from evaluation.oracle import oracle_with_restarts, oracle_without_restarts
from evaluation.ticks import Policy
from monitor.windows import add_report, close_window
from pipeline.loadgen import read_trace
from pipeline.loadgen import rescale as rescale_trace
from plan.ds2 import plan_ds2
from plan.proactive import capacity_function

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
RESULTS = Path("results")  # relative to where the command runs
EPOCH = 1_700_000_000.0  # metric time of simulated second 0 (window-aligned)
WINDOW_S = 10.0  # the agents' default loop interval
REPORTS_PER_WINDOW = 2  # the reporter's interval is half a window, so the backlog's growth is seen
FORECAST_STEP_S = 60.0  # the proactive policies' forecaster sees one point a minute (see docs/results.md)
EPSILON = 1e-9

# The demo job (`pipeline/demo_job.py`, cost_ms=4) as measured live with the agents and the load
# generator on the same 2 cores (`python -m bench.proactive_live`): DS2 true rate 215 rec/s per slot
# at 1 slot and about 199 at 4 (a knee at 3 slots, each further slot adding 80 %); restarts 15-27 s
# to scale up (median 22.7 s) and 9-28 s to scale down (median 12.1 s); per-window rates varying
# by 12-15 % (5 s windows). See docs/results.md, "Calibration".
DEMO_SLOT_RATE = 215.0
DEMO_KNEE = 3
DEMO_EFFICIENCY_BEYOND_KNEE = 0.8
DEMO_DOWNTIME_UP_S = 22.7
DEMO_DOWNTIME_DOWN_S = 12.1
DEMO_RATE_NOISE = 0.1  # sigma of the per-window log-normal factor on the slot rate (10 s windows)
DEMO_CHECKPOINT_S = 5.0  # the demo job's trigger: offsets are committed every micro-batch

POLICIES = ("static", "threshold", "ds2", "flink", "daedalus", "hybrid", "ours")
PROACTIVE = ("daedalus", "hybrid")
TRACE_NAMES = ("sine", "cos", "avazu", "iot", "wiki", "taylor", "steps", "spikes")
SHARED_TRACES = ("sine", "cos", "avazu", "iot", "wiki")  # the five real traces in evaluation/traces
TRACE_FILES = {"sine": "sine_60000_6h.csv", "cos": "cos_40000_6h.csv", "avazu": "avazu_5min.csv",
               "iot": "IoT_5min.csv", "wiki": "wiki_en_5min.csv"}
ROW_SECONDS = {"sine": 1.0, "cos": 1.0, "avazu": 25.0, "iot": 25.0, "wiki": 25.0, "taylor": 30.0}
NATIVE_ROW_SECONDS = {"sine": 1.0, "cos": 1.0, "avazu": 300.0, "iot": 300.0, "wiki": 300.0, "taylor": 1800.0}


def demo_model() -> JobModel:
    demo = Operator("demo", DEMO_SLOT_RATE, knee=DEMO_KNEE, efficiency_beyond_knee=DEMO_EFFICIENCY_BEYOND_KNEE)
    return JobModel(operators=(demo,), fused=True, partitions=64, checkpoint_interval_s=DEMO_CHECKPOINT_S,
                    downtime_up_s=DEMO_DOWNTIME_UP_S, downtime_down_s=DEMO_DOWNTIME_DOWN_S)


# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class Trace:
    name: str
    rates: np.ndarray  # records/s per window
    window_s: float
    description: str
    sha256: str | None = None

    @property
    def duration_s(self) -> float:
        return len(self.rates) * self.window_s


def _synthetic(name: str, seconds: int) -> np.ndarray:
    t = np.arange(seconds, dtype=float)
    if name == "steps":  # a level every 30 minutes, up and down
        levels = np.array([0.2, 0.6, 0.3, 1.0, 0.5, 0.8, 0.15, 0.7, 0.4, 0.9, 0.25, 0.55])
        return levels[(t // 1800).astype(int) % len(levels)]
    # spikes: a quiet base with a 3-minute burst to the peak every 45 minutes
    return np.where((t % 2700) >= 2520, 1.0, 0.3)


def load_trace(name: str, hours: float = 6.0, peak: float = 1400.0, low_fraction: float = 0.125,
               window_s: float = WINDOW_S, row_seconds: float | None = None) -> Trace:
    """`hours` of replay as one arrival rate per window, the trace's min..max mapped linearly onto
    `low_fraction` x peak .. peak (the shape is kept). One row of the trace lasts `row_seconds` of
    replay (default `ROW_SECONDS`: slower traces are time-compressed)."""
    seconds = round(hours * 3600)
    digest = None
    if name in ("steps", "spikes"):
        raw, row_s, what = _synthetic(name, seconds), 1.0, f"synthetic {name}"
    else:
        if name == "taylor":
            import pmdarima as pm

            values = np.asarray(pm.datasets.load_taylor(), dtype=float)
            source = "pmdarima.datasets.load_taylor()"
        else:
            path = TRACES / TRACE_FILES[name]
            values = np.asarray(read_trace(path), dtype=float)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            source = TRACE_FILES[name]
        row_s = row_seconds or ROW_SECONDS[name]
        rows = min(len(values), math.ceil(seconds / row_s))
        raw = values[:rows]
        compression = NATIVE_ROW_SECONDS[name] / row_s
        covered = rows * NATIVE_ROW_SECONDS[name] / 3600
        what = (f"{source}: first {covered:g} h of the trace" + (
            f", {compression:g}x compressed (one {NATIVE_ROW_SECONDS[name]:g}-s row = {row_s:g} s)"
            if compression > 1 else " in real time"))
    mapped = np.asarray(rescale_trace(list(raw), low=low_fraction * peak, high=peak))
    windows = math.ceil(seconds / window_s - EPSILON)
    midpoints = (np.arange(windows) + 0.5) * window_s
    if row_s >= window_s:
        rates = np.interp(midpoints, (np.arange(len(mapped)) + 0.5) * row_s, mapped)
    else:  # average the rows of each window
        per = round(window_s / row_s)
        usable = mapped[: (len(mapped) // per) * per]
        rates = usable.reshape(-1, per).mean(axis=1)[:windows]
    return Trace(name, rates, window_s, what, digest)


# ---------------------------------------------------------------- policies as the simulator drives them


@dataclass
class StaticPolicy:
    """Provisioned once for the peak; never rescales."""

    name: str = "static"

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        return None

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        return None


@dataclass
class DS2Alone:
    """DS2 as the paper runs it: the one-step optimal parallelism every window, after one warm-up
    window at each parallelism, no other guard."""

    config: JobConfig
    name: str = "ds2"
    warm_up_left: int = 1

    def decide(self, analysis: Analysis, *, rescaling: bool) -> int | None:
        if rescaling or not analysis.valid:
            return None
        if self.warm_up_left > 0:
            self.warm_up_left -= 1
            return None
        plan = plan_ds2(analysis, self.config)
        return None if plan.action is Action.NONE else plan.to_parallelism

    def on_rescaled(self, to_parallelism: int, downtime_s: float, completed_at: float) -> None:
        self.warm_up_left = 1


@dataclass(frozen=True)
class ForecastStream:
    """The arrival-rate forecasts analyze would publish, made once per trace: the arrival rate is
    the load's, whatever the policy does, so every proactive policy sees the same forecasts."""

    made_at: list[float]
    views: list[ForecastView | None]
    wapes: list[float]
    methods: list[str]
    refits: int
    seconds: float

    def at(self, t: float) -> ForecastView | None:
        i = bisect.bisect_right(self.made_at, t + EPSILON) - 1
        return self.views[i] if i >= 0 else None


def forecast_stream(trace: Trace, config: JobConfig, step_s: float = FORECAST_STEP_S) -> ForecastStream:
    started = time.perf_counter()
    settings = forecast_config(step_s, config.forecast_horizon_s, config.forecast_wape_threshold,
                               config.forecast_retrain_after, config.forecast_min_points)
    per = max(1, round(step_s / trace.window_s))
    points = trace.rates[: (len(trace.rates) // per) * per].reshape(-1, per).mean(axis=1)
    state, model = ForecastState(), None
    made_at: list[float] = []
    views: list[ForecastView | None] = []
    wapes: list[float] = []
    methods: list[str] = []
    refits = 0
    for k, value in enumerate(points):
        now = EPOCH + (k + 1) * per * trace.window_s
        state, decision = step(state, [float(value)], now, settings, model)
        model = decision.model
        made_at.append(now)
        views.append(forecast_view(decision))
        methods.append(decision.method or "none")
        if decision.wape is not None:
            wapes.append(decision.wape)
        if decision.retrain is not None:
            # Live, the refit runs in a process pool and is installed a few seconds later: before
            # the next point a minute later, as here.
            refits += 1
            fitted = None
            with contextlib.suppress(Exception):
                fitted = fit_model(decision.retrain.history, settings)
            state, model = install_model(state, fitted, decision.retrain.request_id, settings, model)
    return ForecastStream(made_at, views, wapes, methods, refits, time.perf_counter() - started)


def make_policy(name: str, config: JobConfig, max_parallelism: int) -> Policy:
    if name == "static":
        return StaticPolicy()
    if name == "threshold":
        return ThresholdPolicy(max_parallelism=max_parallelism)
    if name == "ds2":
        return DS2Alone(config)
    if name == "flink":
        return FlinkStylePolicy(max_parallelism=max_parallelism)
    if name in PROACTIVE:
        return OurPolicy(config.model_copy(update={"policy": JobPolicy(name)}), name=name)
    if name == "ours":
        return OurPolicy(config, name="ours")
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


# ---------------------------------------------------------------- one run


@dataclass
class Timeline:
    t: list[float] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    capacity: list[float] = field(default_factory=list)
    parallelism: list[int] = field(default_factory=list)
    backlog: list[float] = field(default_factory=list)


@dataclass
class PolicyRun:
    policy: str
    trace: str
    slot_seconds: float
    beyond_target_s: float
    lag_p95_s: float
    lag_max_s: float
    scale_ups: int
    scale_downs: int
    ignored_decisions: int
    final_backlog: float
    records_arrived: float
    mean_utilization: float
    capacity_error_pct: float | None
    seconds: float
    timeline: Timeline

    @property
    def actions(self) -> int:
        return self.scale_ups + self.scale_downs

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "timeline"}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()} | {"actions": self.actions}


def static_parallelism(model: JobModel, peak: float, max_parallelism: int) -> int:
    """The fewest slots whose capacity carries the peak."""
    for p in range(1, max_parallelism + 1):
        if model.capacity(p) >= peak:
            return p
    return max_parallelism


def simulate(
    trace: Trace,
    model: JobModel,
    policy: Policy,
    config: JobConfig,
    initial_parallelism: int,
    backlog_target_s: float,
    forecasts: ForecastStream | None = None,
    seed: int = 0,
    rate_noise: float = DEMO_RATE_NOISE,
    job_id: str = "eval",
) -> PolicyRun:
    """Replay `trace` into `model` under `policy`, one window at a time (see the module docstring)."""
    started = time.perf_counter()
    w = trace.window_s
    half = w / REPORTS_PER_WINDOW
    rng = np.random.default_rng(seed)
    noise = rng.lognormal(-rate_noise**2 / 2, rate_noise, len(trace.rates)) if rate_noise else np.ones(len(trace.rates))
    state = JobState([initial_parallelism] * (1 if model.fused else len(model.operators)))
    learned = new_learned(config.anomaly_k, config.backlog_tolerance_s) if forecasts is not None else None
    recent: deque[Analysis] = deque(maxlen=60)
    timeline = Timeline()
    lags: list[float] = []
    beyond = 0.0
    ups = downs = ignored = 0
    capacity_errors: list[float] = []
    pending_completion: tuple[float, float] | None = None
    for i, rate in enumerate(trace.rates):
        start, end = EPOCH + i * w, EPOCH + (i + 1) * w
        rate = float(rate)
        window = None
        for k in range(REPORTS_PER_WINDOW):
            s = start + k * half
            outcome = advance(model, state, s, half, rate, float(noise[i]))
            sent = report(model, state, job_id, s + half, outcome, rate)
            if sent is not None:
                window, _ = add_report(window, sent, w)
        if pending_completion is not None and pending_completion[1] <= end:
            policy.on_rescaled(state.job_parallelism, pending_completion[0], pending_completion[1])
            pending_completion = None
        restarting = pending_completion is not None
        true_capacity = model.capacity(state.parallelism if not model.fused else state.job_parallelism)
        lag = state.backlog / rate if rate > 0 else 0.0
        lags.append(lag)
        if state.backlog > backlog_target_s * rate + EPSILON:
            beyond += w
        timeline.t.append((i + 1) * w)
        timeline.arrival.append(rate)
        timeline.capacity.append(true_capacity)
        timeline.parallelism.append(state.job_parallelism)
        timeline.backlog.append(state.backlog)
        if window is None:
            continue  # the job was down the whole window: no reports, no window, no decision
        closed = close_window(window, job_id, w).model_copy(update={"closed_at": end})
        fallback = next((a.model_dump() for a in reversed(recent) if a.valid), None) if closed.records_in == 0 else None
        analysis = analyze_window(closed, fallback)
        if learned is not None and forecasts is not None:
            learned, capacity, recovery = learn(learned, closed, analysis)
            analysis = analysis.model_copy(update={"capacity": capacity, "forecast": forecasts.at(end),
                                                   "recovery": recovery})
        recent.append(analysis)
        estimate = capacity_estimate(policy.name, analysis)
        if estimate is not None and not restarting:
            capacity_errors.append(abs(estimate - true_capacity) / true_capacity)
        wanted = policy.decide(analysis, rescaling=restarting)
        if wanted is None or wanted == state.job_parallelism:
            continue
        if restarting:
            ignored += 1  # one rescale at a time, as execute's lock enforces
            continue
        if wanted > state.job_parallelism:
            ups += 1
        else:
            downs += 1
        downtime = rescale(model, state, wanted, end)
        pending_completion = (downtime, end + downtime)
    lag_array = np.asarray(lags)
    return PolicyRun(
        policy=policy.name, trace=trace.name, slot_seconds=state.slot_seconds, beyond_target_s=beyond,
        lag_p95_s=float(np.percentile(lag_array, 95)), lag_max_s=float(lag_array.max()),
        scale_ups=ups, scale_downs=downs, ignored_decisions=ignored, final_backlog=state.backlog,
        records_arrived=state.arrived,
        mean_utilization=state.busy_slot_seconds / state.slot_seconds if state.slot_seconds else 0.0,
        capacity_error_pct=100 * float(np.mean(capacity_errors)) if capacity_errors else None,
        seconds=time.perf_counter() - started, timeline=timeline,
    )


def capacity_estimate(policy: str, analysis: Analysis) -> float | None:
    """The capacity at the current parallelism the policy plans with, where it has one: the
    proactive policies' capacity function; DS2's true rate x slots for the policies built on it."""
    if not analysis.valid:
        return None
    p = analysis.parallelism
    if policy in PROACTIVE:
        capacity_of, _ = capacity_function(analysis, JobPolicy(policy))
        return None if capacity_of is None else capacity_of(p)
    if policy in ("ds2", "flink", "ours") and analysis.true_processing_rate > 0:
        return analysis.true_processing_rate * p
    return None


# ---------------------------------------------------------------- one trace: every policy and the oracle


@dataclass(frozen=True)
class EvalSettings:
    hours: float = 6.0
    peak: float = 1400.0
    max_parallelism: int = 12
    backlog_target_s: float = 60.0
    oracle_decision_s: float = 60.0
    seed: int = 0
    rate_noise: float = DEMO_RATE_NOISE


def eval_config(settings: EvalSettings) -> JobConfig:
    """Our defaults, with the forecaster's first fit after 30 points (30 minutes at one a minute)."""
    return JobConfig(max_parallelism=settings.max_parallelism, forecast_min_points=30)


def one_blas_thread() -> None:
    """Small linear algebra in two processes on two cores: BLAS threads would only contend. The
    limit covers loaded libraries only, so scipy's and pmdarima's are loaded first."""
    import pmdarima  # noqa: F401
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


def evaluate_trace(name: str, policies: Sequence[str], settings: EvalSettings) -> dict[str, Any]:
    started = time.perf_counter()
    if any(p in PROACTIVE for p in policies):
        one_blas_thread()
    model = demo_model()
    trace = load_trace(name, settings.hours, settings.peak)
    config = eval_config(settings)
    static_p = static_parallelism(model, float(trace.rates.max()), settings.max_parallelism)
    forecasts = forecast_stream(trace, config) if any(p in PROACTIVE for p in policies) else None
    capacities = np.array([0.0, *(model.capacity(p) for p in range(1, settings.max_parallelism + 1))])
    # The oracle keeps the same target at every window (no grace after its rescales: a restart's
    # backlog, about 27 s of arrivals for the demo job, fits the 60 s target), and replays on
    # average half a checkpoint interval of the mean rate per restart.
    oracle_args: dict[str, Any] = {
        "dt": trace.window_s, "restart_downtime_s": max(model.downtime_up_s, model.downtime_down_s),
        "replay_records": float(trace.rates.mean()) * model.checkpoint_interval_s / 2,
        "backlog_target_s": settings.backlog_target_s, "grace_s": 0.0, "decision_s": settings.oracle_decision_s,
        "initial_parallelism": static_p,
    }
    oracle = oracle_with_restarts(trace.rates, capacities, **oracle_args)
    loose = oracle_without_restarts(trace.rates, capacities, **oracle_args)
    runs = []
    for policy_name in policies:
        policy = make_policy(policy_name, config, settings.max_parallelism)
        start_p = static_p if policy_name == "static" else max(1, math.ceil(static_p / 2))
        runs.append(simulate(trace, model, policy, config, start_p, settings.backlog_target_s,
                             forecasts if policy_name in PROACTIVE else None, settings.seed, settings.rate_noise))
    static_cost = static_p * trace.duration_s
    rows = []
    for run in runs:
        rows.append(run.summary() | {
            "vs_static_pct": round(100 * run.slot_seconds / static_cost, 1),
            "vs_oracle_pct": round(100 * run.slot_seconds / oracle.slot_seconds, 1),
        })
    return {
        "trace": name, "description": trace.description, "sha256": trace.sha256, "windows": len(trace.rates),
        "peak_rate": round(float(trace.rates.max()), 1), "mean_rate": round(float(trace.rates.mean()), 1),
        "static_parallelism": static_p, "static_slot_seconds": static_cost,
        "oracle": {"slot_seconds": round(oracle.slot_seconds, 1), "rescales": oracle.rescales,
                   "feasible": oracle.feasible, "violation_s": oracle.violation_s,
                   "certified_optimal": oracle.certified_optimal,
                   "gap_slot_seconds": round(oracle.gap_slot_seconds, 1),
                   "vs_static_pct": round(100 * oracle.slot_seconds / static_cost, 1),
                   "without_restarts_slot_seconds": round(loose.slot_seconds, 1)},
        "forecast": None if forecasts is None else {
            "mean_wape": round(float(np.mean(forecasts.wapes)), 4) if forecasts.wapes else None,
            "refits": forecasts.refits, "seconds": round(forecasts.seconds, 2),
            "arima_share": round(forecasts.methods.count("arima") / max(1, len(forecasts.methods)), 3),
        },
        "runs": rows,
        "timelines": {run.policy: _thin(run.timeline) for run in runs}
        | {"oracle": {"t": list(np.arange(1, len(trace.rates) + 1) * trace.window_s),
                      "parallelism": [int(x) for x in oracle.parallelism]}},
        "seconds": round(time.perf_counter() - started, 2),
    }


def _thin(timeline: Timeline, every: int = 3) -> dict[str, list[float]]:
    """Every `every`-th window, enough for a plot of hours."""
    return {k: [round(float(x), 2) for x in v[::every]] for k, v in timeline.__dict__.items()}


# ---------------------------------------------------------------- output


def print_table(console: Console, results: list[dict[str, Any]]) -> None:
    for result in results:
        table = Table(title=f"{result['trace']}: {result['description']}; peak {result['peak_rate']:.0f} rec/s, "
                      f"static {result['static_parallelism']} slots, oracle "
                      f"{result['oracle']['vs_static_pct']:.0f} % of static", title_justify="left")
        wape = (result["forecast"] or {}).get("mean_wape")
        for column in ("policy", "slot-s vs static", "vs oracle", "beyond target", "lag p95", "lag max",
                       "actions", "capacity err", "forecast WAPE"):
            table.add_column(column, justify="right" if column != "policy" else "left")
        for row in result["runs"]:
            table.add_row(
                row["policy"], f"{row['vs_static_pct']:.0f} %", f"{row['vs_oracle_pct']:.0f} %",
                f"{row['beyond_target_s'] / 60:.1f} min", f"{row['lag_p95_s']:.0f} s", f"{row['lag_max_s']:.0f} s",
                str(row["actions"]),
                "-" if row["capacity_error_pct"] is None else f"{row['capacity_error_pct']:.1f} %",
                f"{100 * wape:.1f} %" if wape is not None and row["policy"] in PROACTIVE else "-",
            )
        console.print(table)


def markdown(results: list[dict[str, Any]], convergence: list[dict[str, Any]]) -> str:
    """The tables of docs/results.md, as the command printed them."""
    lines: list[str] = []
    for result in results:
        oracle = result["oracle"]
        wape = (result["forecast"] or {}).get("mean_wape")
        lines += [f"**{result['trace']}**: {result['description']}; peak {result['peak_rate']:.0f} rec/s, mean "
                  f"{result['mean_rate']:.0f}; static {result['static_parallelism']} slots; oracle "
                  f"{oracle['vs_static_pct']:.0f} % of static with {oracle['rescales']} rescales"
                  + (" (proven optimal)" if oracle.get("certified_optimal") else "")
                  + ("" if wape is None else f"; forecast WAPE {100 * wape:.1f} %"), "",
                  "| policy | slot-s vs static | vs oracle | beyond target | lag p95 | lag max | actions | "
                  "capacity error |", "|---|---|---|---|---|---|---|---|"]
        for row in result["runs"]:
            error = "-" if row["capacity_error_pct"] is None else f"{row['capacity_error_pct']:.1f} %"
            lines.append(f"| {row['policy']} | {row['vs_static_pct']:.0f} % | {row['vs_oracle_pct']:.0f} % | "
                         f"{row['beyond_target_s'] / 60:.1f} min | {row['lag_p95_s']:.0f} s | "
                         f"{row['lag_max_s']:.0f} s | {row['actions']} | {error} |")
        lines.append("")
    if convergence:
        lines += ["| pipeline | start | from | optimal | steps (parallelism after each) | reached |",
                  "|---|---|---|---|---|---|"]
        for row in convergence:
            path = " -> ".join(str(tuple(p)) for p in row["path"]) or "(holds)"
            lines.append(f"| {row['pipeline']} | {row['start']} | {tuple(row['from'])} | {tuple(row['optimal'])} | "
                         f"{row['steps']}: {path} | {'yes' if row['reached'] else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timelines = {k: v for k, v in result["timelines"].items() if k != "oracle"}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.2 * len(timelines)), sharex=True, squeeze=False)
    oracle = result["timelines"]["oracle"]
    for ax, (name, tl) in zip(axes[:, 0], timelines.items(), strict=True):
        hours = np.asarray(tl["t"]) / 3600
        ax.plot(hours, tl["arrival"], color="black", lw=0.8, label="arrival rate")
        ax.plot(hours, tl["capacity"], color="tab:blue", lw=0.8, label="capacity")
        ax.fill_between(hours, 0, np.asarray(tl["backlog"]) / 60, color="tab:red", alpha=0.3,
                        label="backlog / 60 (records)")
        ax.set_ylabel("records/s")
        right = ax.twinx()
        right.step(hours, tl["parallelism"], where="post", color="tab:orange", lw=1.0, label="parallelism")
        right.step(np.asarray(oracle["t"]) / 3600, oracle["parallelism"], where="post", color="tab:green", lw=0.6,
                   alpha=0.7, label="oracle parallelism")
        right.set_ylabel("slots")
        ax.set_title(name, loc="left", fontsize=9)
    handles = [*axes[0, 0].get_legend_handles_labels()[0], *axes[0, 0].figure.axes[-1].get_legend_handles_labels()[0]]
    axes[0, 0].legend(handles=handles, loc="upper right", fontsize=7, ncol=5)
    axes[-1, 0].set_xlabel("hours of replay")
    fig.suptitle(f"{result['trace']}: {result['description']}", fontsize=9)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['trace']}.png"
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def evaluate_all(traces: Sequence[str], policies: Sequence[str], settings: EvalSettings, workers: int,
                 on_done: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    if workers <= 1 or len(traces) <= 1:
        results = []
        for name in traces:
            results.append(evaluate_trace(name, policies, settings))
            on_done(name)
        return results
    by_name: dict[str, dict[str, Any]] = {}
    # Spawned workers: the parent may hold threads (rich's progress bar), which fork would copy.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(evaluate_trace, name, list(policies), settings): name for name in traces}
        for future in as_completed(futures):
            by_name[futures[future]] = future.result()
            on_done(futures[future])
    return [by_name[name] for name in traces]


bench_app = typer.Typer(help="Benchmarks and the evaluation suite.", no_args_is_help=True)


@bench_app.command("evaluate")
def evaluate_command(
    policy: Annotated[list[str] | None, typer.Option(help=f"Policies ({', '.join(POLICIES)}); default all.")] = None,
    trace: Annotated[list[str] | None, typer.Option(
        help=f"Traces ({', '.join(TRACE_NAMES)}); default the five real ones and taylor.")] = None,
    hours: Annotated[float, typer.Option(help="Hours of load replayed per trace.")] = 6.0,
    peak: Annotated[float, typer.Option(help="Every trace's maximum is mapped to this rate (rec/s).")] = 1400.0,
    max_parallelism: Annotated[int, typer.Option(help="Largest parallelism any policy may use.")] = 12,
    backlog_target_s: Annotated[float, typer.Option(help="Backlog target, in seconds of arrivals.")] = 60.0,
    workers: Annotated[int, typer.Option(help="Processes, one trace each at a time.")] = 2,
    json_out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "evaluate.json",
    plots: Annotated[Path | None, typer.Option(help="Folder of the PNG plots; default next to the JSON.")] = None,
    live: Annotated[bool, typer.Option(help="Replay one trace against the real Spark job through the agents.")] = False,
    live_minutes: Annotated[float, typer.Option(help="--live: minutes of replay.")] = 12.0,
    live_trace_hours: Annotated[float, typer.Option(help="--live: hours of the trace replayed in them.")] = 2.0,
) -> None:
    """Run the chosen policies on the chosen traces; print a table, write JSON and PNG plots."""
    console = Console(width=None if console_is_tty() else 150)
    policies = policy or list(POLICIES)
    traces = trace or [*SHARED_TRACES, "taylor"]
    for name in policies:
        if name not in POLICIES:
            raise typer.BadParameter(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    for name in traces:
        if name not in TRACE_NAMES:
            raise typer.BadParameter(f"unknown trace {name!r}; choose from {', '.join(TRACE_NAMES)}")
    settings = EvalSettings(hours=hours, peak=peak, max_parallelism=max_parallelism,
                            backlog_target_s=backlog_target_s)
    if live:
        from evaluation.live import run_live_evaluation

        run_live_evaluation(console, traces[0], policies[0] if policy else "ours", settings, live_minutes, json_out,
                            live_trace_hours)
        return
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{len(policies)} policies x {len(traces)} traces", total=len(traces))
        results = evaluate_all(traces, policies, settings, workers,
                               on_done=lambda name: progress.advance(task))
    elapsed = time.perf_counter() - started
    print_table(console, results)
    plot_dir = plots or json_out.parent / "evaluate"
    paths = [plot(result, plot_dir) for result in results]
    ds2_convergence = experiment()
    print_convergence(console, ds2_convergence)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({
        "settings": settings.__dict__, "policies": policies, "traces": traces, "wall_s": round(elapsed, 2),
        "calibration": calibration(), "results": results, "ds2_convergence": ds2_convergence,
    }, indent=1))
    json_out.with_suffix(".md").write_text(markdown(results, ds2_convergence))
    console.print(f"{len(policies)} policies x {len(traces)} traces in {elapsed:.1f} s; wrote {json_out}, "
                  f"{json_out.with_suffix('.md').name} and {len(paths)} plots in {plot_dir}")


def print_convergence(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="DS2 convergence on a 3-operator pipeline at a steady 3,000 rec/s (evaluation.convergence)",
                  title_justify="left")
    for column in ("pipeline", "start", "from", "optimal", "steps", "path", "reached"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["pipeline"], row["start"], str(tuple(row["from"])), str(tuple(row["optimal"])),
                      str(row["steps"]), " -> ".join(str(tuple(p)) for p in row["path"]) or "(holds)",
                      "yes" if row["reached"] else "no")
    console.print(table)


def console_is_tty() -> bool:
    import sys

    return sys.stdout.isatty()


def calibration() -> dict[str, Any]:
    return {"slot_rate": DEMO_SLOT_RATE, "knee": DEMO_KNEE, "efficiency_beyond_knee": DEMO_EFFICIENCY_BEYOND_KNEE,
            "downtime_up_s": DEMO_DOWNTIME_UP_S,
            "downtime_down_s": DEMO_DOWNTIME_DOWN_S, "rate_noise": DEMO_RATE_NOISE,
            "checkpoint_interval_s": DEMO_CHECKPOINT_S, "window_s": WINDOW_S,
            "reports_per_window": REPORTS_PER_WINDOW, "forecast_step_s": FORECAST_STEP_S}


if __name__ == "__main__":
    bench_app()

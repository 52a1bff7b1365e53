"""Executor profiles planned on the job model, whose truth is known (QEScalor; `capacity.profiles`).

`profile_plan` samples a grid of executor profiles on the `ProfileTestbed` (dynamic sampling, or a
fixed step as QEScalor's baseline), fits the random forest, and plans a rate; beside it, what the truth
says: the model's error on every profile of the grid, whether the planned executors sustain the rate,
and the cost of the cheapest plan the truth allows (the hindsight oracle, the same headroom and grid)
and of fixed profiles a user might pick without a model (Spark's default executor, 1 core and 1 GB;
and 4 cores with 2 GB per core), each sized by the truth with the same headroom.
`autoscaler capacity profiles` and `python -m bench.capacity_profiles` both call it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from capacity.profiles import (
    HEADROOM,
    MAX_EXECUTORS,
    Profile,
    ProfilePlan,
    Sample,
    best_reachable,
    cheapest_plan,
    dynamic_sampling,
    fixed_sampling,
    plan_from_samples,
)
from capacity.testbed import ProfileTestbed, ProfileTruth

CORES = (1, 2, 3, 4)
MEMORY_GB = tuple(0.5 * i for i in range(1, 17))  # 0.5 to 8 GB
# Prices per hour of one core and of one GB: the ratio (about 7.5) of a public cloud's custom machine
# types. Only the ratio matters to which profile is cheapest.
CORE_PRICE, GB_PRICE = 0.0332, 0.00445
FIXED = {"Spark's default (1 core, 1 GB)": Profile(1, 1.0), "4 cores, 8 GB": Profile(4, 8.0)}


class UnstableTestbed(ValueError):
    """Too few profiles sustained any rate to fit a model."""


def parse_sampling(sampling: str) -> int | None:
    """`dynamic` -> None; `fixed:N` -> N (every N-th memory size)."""
    if sampling == "dynamic":
        return None
    name, _, stride = sampling.partition(":")
    if name == "fixed" and stride.isdigit() and int(stride) >= 1:
        return int(stride)
    raise ValueError(f"sampling is 'dynamic' or 'fixed:N' (N >= 1), got {sampling!r}")


def sample_profiles(testbed: ProfileTestbed, sampling: str, cores: tuple[int, ...] = CORES,
                    memory_gb: tuple[float, ...] = MEMORY_GB) -> list[Sample]:
    stride = parse_sampling(sampling)
    if stride is None:
        return dynamic_sampling(testbed.measure, cores, memory_gb)
    return fixed_sampling(testbed.measure, cores, memory_gb, stride)


def truth_plan(truth: ProfileTruth, profiles: list[Profile], rate: float, core_price: float,
               gb_price: float) -> ProfilePlan | None:
    exact = {p: (truth.executor_mst(p),) * 3 for p in profiles}
    return cheapest_plan(exact, rate, core_price, gb_price)


def plan_of(report: dict[str, Any]) -> ProfilePlan:
    """The forest's plan of a `profile_plan` report (which has one)."""
    row = report["plan"]
    return ProfilePlan(Profile(row["cores"], row["memory_gb"]), row["executors"], row["predicted"], row["low"],
                       row["high"], row["cost_per_hour"])


def plan_row(plan: ProfilePlan | None, truth: ProfileTruth, rate: float) -> dict[str, Any] | None:
    if plan is None:
        return None
    true = plan.executors * truth.executor_mst(plan.profile)
    return {**plan.row(), "true_throughput": true, "sustains": true >= rate, "over_rate": true / rate - 1}


def profile_plan(rate: float, sampling: str = "dynamic", seed: int = 0, truth: ProfileTruth | None = None,
                 core_price: float = CORE_PRICE, gb_price: float = GB_PRICE, measure_s: float = 300.0,
                 cores: tuple[int, ...] = CORES, memory_gb: tuple[float, ...] = MEMORY_GB) -> dict[str, Any]:
    """Sample, fit, plan `rate`, and compare with the truth (see the module)."""
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError("the rate must be a positive number")
    truth = truth or ProfileTruth()
    testbed = ProfileTestbed(truth, seed=seed, measure_s=measure_s)
    samples = sample_profiles(testbed, sampling, cores, memory_gb)
    stable = [s for s in samples if s.stable]
    if len(stable) < 2:
        raise UnstableTestbed(f"only {len(stable)} of {len(samples)} profiles sustained a rate: no model to fit")
    grid = [Profile(c, m) for c in cores for m in memory_gb]
    forest = plan_from_samples(stable, grid, rate, core_price, gb_price, seed)
    plan = forest.plan
    true = np.array([truth.executor_mst(p) for p in grid])
    relative = np.array([forest.predicted[p][0] for p in grid]) / true - 1
    best, reachable = best_reachable(forest.candidates)
    oracle = truth_plan(truth, grid, rate, core_price, gb_price)
    fixed = {name: truth_plan(truth, [p], rate, core_price, gb_price)
             for name, p in FIXED.items()}
    return {
        "rate": rate, "sampling": sampling, "seed": seed, "headroom": HEADROOM,
        "prices": {"core": core_price, "gb": gb_price},
        "samples": [{"cores": s.profile.cores, "memory_gb": s.profile.memory_gb, "throughput": s.throughput,
                     "true": truth.executor_mst(s.profile), "measurements": s.measurements, "stable": s.stable}
                    for s in samples],
        "measurements": sum(s.measurements for s in samples),
        "grid_size": len(grid),
        "testbed_core_hours": testbed.slot_seconds / 3600,
        "model_error": {"rmse_pct": float(100 * np.sqrt(np.mean(relative**2))),
                        "mae_pct": float(100 * np.mean(np.abs(relative))),
                        "worst_pct": float(100 * relative[np.argmax(np.abs(relative))])},
        "surface": [{"cores": p.cores, "memory_gb": p.memory_gb, "predicted": forest.predicted[p][0],
                     "low": forest.predicted[p][1], "high": forest.predicted[p][2], "true": float(t)}
                    for p, t in zip(grid, true, strict=True)],
        "plan": plan_row(plan, truth, rate),
        "best_reachable": None if plan else {"profile": str(best), "executors": MAX_EXECUTORS,
                                             "predicted": reachable, "headroom_rate": reachable / HEADROOM},
        "oracle": plan_row(oracle, truth, rate),
        "fixed": {name: plan_row(p, truth, rate) for name, p in fixed.items()},
    }

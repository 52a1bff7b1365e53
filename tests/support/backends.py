"""The backends' comparison: the three arms of `python -m bench.backends_live` (in place, restarts,
Spark's dynamic allocation), what they cost in executor-seconds and how the runs summarize, and
`python -m bench.backends_sim`'s per-case comparison of the suite run with restarts and in place."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

ARMS = ("inplace", "restart", "dynamic")


def arm_setup(arm: str, master: str, max_parallelism: int) -> tuple[list[str], dict[str, str], int]:
    """The job runner's arguments, the job's registration and the parallelism it starts at, per arm."""
    base = ["--master", master]
    if arm == "inplace":
        return [*base, "--backend", "inplace"], {"scaling_backend": "in_place"}, 1
    if arm == "restart":
        return [*base, "--backend", "restart"], {}, 1
    if arm == "dynamic":
        # The application may grow to the maximum (spark.cores.max); dynamic allocation decides how many
        # executors it holds, from one. Spark's defaults otherwise (1 s backlog timeout, 60 s idle timeout).
        conf = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
                "spark.dynamicAllocation.minExecutors": "1", "spark.dynamicAllocation.initialExecutors": "1",
                "spark.dynamicAllocation.maxExecutors": str(max_parallelism),
                "spark.scheduler.minRegisteredResourcesRatio": "0"}
        return [*base, "--backend", "restart", *(x for k, v in conf.items() for x in ("--conf", f"{k}={v}"))], \
            {"mode": "recommend"}, max_parallelism
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")


def executor_seconds(samples: list[tuple[float, int]], begin: float, end: float) -> float:
    """The integral of the cores in use over [begin, end], each sample holding until the next."""
    total = 0.0
    ordered = sorted(samples)
    for (t, cores), (t_next, _) in zip(ordered, [*ordered[1:], (end, 0)][:len(ordered)], strict=True):
        lo, hi = max(t, begin), min(t_next, end)
        if hi > lo:
            total += cores * (hi - lo)
    return total


def rotated(arms: list[str], round_: int) -> list[str]:
    """The arms in the order round `round_` runs them: each round starts one arm later, so that no arm is
    always first on a fresh cluster."""
    k = round_ % len(arms)
    return [*arms[k:], *arms[:k]]


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per arm: the number of runs and, for each measure, the median with the worst run in brackets (the
    highest: every measure here is better lower); actions and executors as the list over the runs."""
    out: dict[str, dict[str, str]] = {}
    for arm in dict.fromkeys(row["arm"] for row in rows):
        runs = [row for row in rows if row["arm"] == arm]
        summary = {"runs": str(len(runs)), "actions": ", ".join(str(r["actions"]) for r in runs),
                   "max_executors": ", ".join(str(r["max_executors"]) for r in runs)}
        for key, fmt in (("executor_seconds", ".0f"), ("beyond_target_s", ".0f"), ("peak_backlog", ".0f"),
                         ("lag_p95_s", ".1f")):
            values = [float(r[key]) for r in runs]
            summary[key] = f"{statistics.median(values):{fmt}} [{max(values):{fmt}}]"
        out[arm] = summary
    return out


def compare(restart: list[dict[str, Any]], in_place: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """Per (trace, regime): the policy's figures under both backends, over the seeds both ran."""
    def rows(cases: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]]:
        out: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        for case in cases:
            run = next(r for r in case["runs"] if r["policy"] == policy)
            out.setdefault((case["trace"], case["regime"]), []).append((run, case["oracle"]))
        return out

    by_restart, by_in_place = rows(restart), rows(in_place)
    table = []
    for key, restarted in by_restart.items():
        changed = by_in_place[key]
        ratios = [b[0]["slot_seconds"] / a[0]["slot_seconds"] for a, b in zip(restarted, changed, strict=True)]
        table.append({
            "trace": key[0], "regime": key[1], "policy": policy, "seeds": len(ratios),
            "in_place_over_restart_median": round(float(np.median(ratios)), 4),
            "in_place_over_restart_worst": round(max(ratios), 4),
            "restart_vs_oracle_median": round(float(np.median([r["vs_oracle"] for r, _ in restarted])), 4),
            "restart_vs_oracle_worst": max(r["vs_oracle"] for r, _ in restarted),
            "in_place_vs_oracle_median": round(float(np.median([r["vs_oracle"] for r, _ in changed])), 4),
            "in_place_vs_oracle_worst": max(r["vs_oracle"] for r, _ in changed),
            "oracle_in_place_over_restart_median": round(float(np.median(
                [b[1]["slot_seconds"] / a[1]["slot_seconds"] for a, b in zip(restarted, changed, strict=True)])), 4),
            "restart_beyond_target_s_worst": max(r["seconds_beyond_target"] for r, _ in restarted),
            "in_place_beyond_target_s_worst": max(r["seconds_beyond_target"] for r, _ in changed),
            "restart_actions_median": float(np.median([r["actions"] for r, _ in restarted])),
            "in_place_actions_median": float(np.median([r["actions"] for r, _ in changed])),
        })
    return table

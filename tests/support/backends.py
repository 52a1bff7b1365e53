"""The backends' comparison: the three arms of `python -m bench.backends_live` (in place, restarts,
Spark's dynamic allocation), the four of `python -m bench.workloads` (those and static at peak), what
they cost in executor-seconds, the event-time latency of a workload's output, how the runs summarize,
and `python -m bench.backends_sim`'s per-case comparison of the suite run with restarts and in place."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

ARMS = ("inplace", "restart", "dynamic")
WORKLOAD_ARMS = ("inplace", "restart", "dynamic", "static")
# A row's newest event time, by the first of these fields it has (epoch s); a window's or a session's
# end bounds its newest event from above, so a latency measured from it is a lower bound.
EVENT_TIME_FIELDS = ("max_ts", "payment_ts", "ts", "window_end", "session_end")


def arm_setup(arm: str, master: str, max_parallelism: int) -> tuple[list[str], dict[str, str], int]:
    """The job runner's arguments, the job's registration and the parallelism it starts at, per arm."""
    base = ["--master", master]
    if arm == "inplace":
        return [*base, "--backend", "inplace"], {"scaling_backend": "in_place"}, 1
    if arm == "restart":
        return [*base, "--backend", "restart"], {}, 1
    if arm == "dynamic":
        # The application may grow to the maximum (spark.cores.max); dynamic allocation decides how many
        # executors it holds, from one.
        return [*base, "--backend", "restart", *dynamic_conf(max_parallelism)], {"mode": "recommend"}, max_parallelism
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")


def dynamic_conf(max_parallelism: int) -> list[str]:
    """Spark's dynamic allocation as `--conf` arguments: the application may grow to `max_parallelism`
    executors (spark.cores.max) from one; Spark's defaults otherwise (1 s backlog timeout, 60 s idle
    timeout)."""
    conf = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.minExecutors": "1", "spark.dynamicAllocation.initialExecutors": "1",
            "spark.dynamicAllocation.maxExecutors": str(max_parallelism),
            "spark.scheduler.minRegisteredResourcesRatio": "0"}
    return [x for k, v in conf.items() for x in ("--conf", f"{k}={v}")]


def workload_arm_setup(arm: str, master: str, max_parallelism: int, static_parallelism: int
                       ) -> tuple[list[str], dict[str, str], int]:
    """`python -m bench.workloads`' arms: the job runner's arguments, the job's registration and the
    parallelism it starts at. `inplace`: the default policy, executors changed in place on the cluster at
    `master`; `restart`: the default policy, restarts in local mode; `dynamic`: Spark's dynamic allocation
    on the cluster, the agents in recommend mode; `static`: `static_parallelism` executors on the cluster
    throughout, the agents in recommend mode."""
    cluster = ["--master", master]
    if arm == "inplace":
        return [*cluster, "--backend", "inplace"], {"scaling_backend": "in_place"}, 1
    if arm == "restart":
        return ["--backend", "restart"], {}, 1
    if arm == "dynamic":
        return [*cluster, "--backend", "restart", *dynamic_conf(max_parallelism)], {"mode": "recommend"}, \
            max_parallelism
    if arm == "static":
        if not 1 <= static_parallelism <= max_parallelism:
            raise ValueError(f"the static parallelism must be in 1..{max_parallelism}, not {static_parallelism}")
        return [*cluster, "--backend", "restart"], {"mode": "recommend"}, static_parallelism
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(WORKLOAD_ARMS)}")


def peak_parallelism(peak_rate: float, slot_rate: float, target_utilization: float, max_parallelism: int) -> int:
    """The slots that carry `peak_rate` records/s at `target_utilization` when one slot carries `slot_rate`
    records/s at full use (at least 1, at most `max_parallelism`): the static arm's size."""
    need = peak_rate / slot_rate / target_utilization
    return max(1, min(max_parallelism, math.ceil(need - 1e-9)))


def parallelism_samples(begin: float, initial: int, switches: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """Samples for `executor_seconds` from a parallelism timeline: `initial` from `begin`, then each
    (time, parallelism) switch; switches before `begin` set the parallelism at `begin`."""
    samples = [(begin, initial)]
    for at, to in sorted(switches):
        if at <= begin:
            samples[0] = (begin, to)
        else:
            samples.append((at, to))
    return samples


def row_event_time(row: Mapping[str, Any]) -> float | None:
    """A workload output row's newest event time (EVENT_TIME_FIELDS), None when it carries none."""
    for name in EVENT_TIME_FIELDS:
        value = row.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def event_time_latencies(records: Iterable[tuple[float, Mapping[str, Any]]]) -> list[float]:
    """Per output row, the seconds from its newest event time to when its record was written: each of
    `records` is (written at, epoch s; the record) and holds its rows under "rows" (a workload's sink) or
    is one row. Rows without an event time are left out."""
    out = []
    for written, record in records:
        rows = record.get("rows")
        for row in rows if isinstance(rows, list) else [record]:
            event = row_event_time(row)
            if event is not None:
                out.append(written - event)
    return out


def latency_summary(latencies: list[float]) -> dict[str, float | int | None]:
    """The rows, the mean and the nearest-rank p95 and maximum of the latencies (None without any)."""
    if not latencies:
        return {"rows": 0, "mean_s": None, "p95_s": None, "max_s": None}
    ordered = sorted(latencies)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return {"rows": len(ordered), "mean_s": round(sum(ordered) / len(ordered), 3), "p95_s": round(p95, 3),
            "max_s": round(ordered[-1], 3)}


def changes(samples: list[tuple[float, int]], begin: float, end: float) -> int:
    """How often the sampled count changed within [begin, end] (e.g. dynamic allocation's executors)."""
    counts = [c for t, c in sorted(samples) if begin <= t <= end]
    return sum(1 for a, b in itertools.pairwise(counts) if a != b)


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


def median_worst(values: Iterable[float | int | None], fmt: str) -> str:
    """'median [worst]' of the values that are not None (worst: the highest; every measure summarized so
    is better lower); '-' when none is."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return "-"
    return f"{statistics.median(present):{fmt}} [{max(present):{fmt}}]"


def summarize_cells(rows: list[dict[str, Any]], keys: tuple[str, ...], measures: Mapping[str, str],
                    listed: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """One summary per distinct `keys` of the rows, in first-seen order: the keys, the number of runs,
    'median [worst]' of each measure (name -> format) and each `listed` field as the list over the runs."""
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in keys), []).append(row)
    out = []
    for cell, runs in cells.items():
        summary = {k: str(v) for k, v in zip(keys, cell, strict=True)} | {"runs": str(len(runs))}
        summary |= {name: median_worst((r.get(name) for r in runs), fmt) for name, fmt in measures.items()}
        summary |= {name: ", ".join(str(r.get(name)) for r in runs) for name in listed}
        out.append(summary)
    return out

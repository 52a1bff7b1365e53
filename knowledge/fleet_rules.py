"""What both knowledge bases check of a fleet: a job names a registered cluster, and a cluster's budget
gives every job on it at least its minimum. One place, so the Redis and in-memory stores refuse alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from contracts.fleet import ClusterConfig, FleetGrant, FleetState
from contracts.jobs import ConfigError

FleetStep = Callable[[FleetState, int], tuple[FleetState, FleetGrant]]
"""The fleet step (`plan.fleet.grant`, bound to one job's bid): (the cluster's state, its budget) ->
(the state to store, the job's grant). Knowledge runs it atomically over the stored state."""

UPDATE_RETRIES = 50  # optimistic updates of one cluster's state raced by other plan workers


def runs(job_id: str, slots: int, cluster: str) -> FleetStep:
    """The fleet step of a job whose rescale ended and which now runs `slots` (the runner's report): what it
    holds on the cluster is that, from now. A completed scale-down's slots are free for the jobs waiting
    for them at once, not from the job's next window; a scale-up granted in part holds what it got. A job
    the fleet does not count yet (never bid nor joined) is left as it is."""
    def step(state: FleetState, budget: int) -> tuple[FleetState, FleetGrant]:
        held = {**state.held, job_id: slots} if job_id in state.held else state.held
        return (state.model_copy(update={"held": held}),
                FleetGrant(cluster=cluster, budget=budget, granted=slots, allocated=slots, binds=False))
    return step


def check_fleet(name: str, cluster: ClusterConfig | None, minimums: Mapping[str, int]) -> None:
    """ConfigError unless `cluster` (named `name`) is registered and its budget is at least the sum of
    `minimums` (each job on it: its `min_parallelism`)."""
    if cluster is None:
        raise ConfigError(f"invalid configuration: cluster: unknown cluster {name!r}; register it first "
                          "(`autoscaler cluster add`)")
    total = sum(minimums.values())
    if total > cluster.budget:
        raise ConfigError(f"invalid configuration: cluster {name!r} has {cluster.budget} slots, below the "
                          f"minimums of its jobs ({total}: {', '.join(sorted(minimums))})")

"""How a job is rescaled, and what an action costs it: shared by execute's backends, which measure
it, and the planner, which plans with it.

Pure. Two ways (`BackendKind`): restart the query from its checkpoint at the new parallelism (a
pause, then the replay since the checkpoint), or change a running application's executors in place
(adding them: the old capacity runs until they registered; removing them: the query held between
two micro-batches while they go; nothing replayed). Each backend's expected cost is learned from what
it measured (`Downtimes`, per direction), with the defaults below until one is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contracts.plan_state import Direction, Downtimes

# Until measured, an in-place change: a new executor's JVM starting and registering (on 2 cores),
# and one micro-batch finishing before the kill.
DEFAULT_RAMP_S = 10.0
DEFAULT_DOWN_PAUSE_S = 3.0


class BackendKind(StrEnum):
    RESTART = "restart"  # stop, then start again from the checkpoint at the new parallelism
    IN_PLACE = "in_place"  # change the resources of the running job


@dataclass(frozen=True)
class ActionCost:
    """What one action is expected to cost the job, in seconds of its input.

    `pause_s`: no processing at all; `reduced_s`: processing below the target's capacity (an
    in-place change while new executors register); `replay_s`: input processed again (what was
    read since the last checkpoint)."""

    pause_s: float
    reduced_s: float = 0.0
    replay_s: float = 0.0


def restart_cost(current: int, target: int, measured: Downtimes, default_s: float,
                 checkpoint_interval_s: float) -> ActionCost:
    """A restart from the checkpoint: the longest recent measured restart in that direction (the
    default until one is measured), and up to a checkpoint interval of input replayed."""
    if target == current:
        return ActionCost(pause_s=0.0)
    direction = Direction.of(current, target)
    return ActionCost(pause_s=measured.expected(direction, default_s), replay_s=checkpoint_interval_s)


def in_place_cost(current: int, target: int, measured: Downtimes, default_ramp_s: float,
                  default_pause_s: float) -> ActionCost:
    """An in-place change of executors: adding them costs the time until they registered (the job
    keeps processing at the old capacity meanwhile); removing them holds the query between two
    micro-batches while they go. Learned from the measured ones (`measured`: an in-place backend
    records a scale-up's time to new capacity and a scale-down's hold), the defaults until one is
    measured; nothing is replayed."""
    if target == current:
        return ActionCost(pause_s=0.0)
    if target > current:
        return ActionCost(pause_s=0.0, reduced_s=measured.expected(Direction.UP, default_ramp_s))
    return ActionCost(pause_s=measured.expected(Direction.DOWN, default_pause_s))


@dataclass(frozen=True)
class PlannedCosts:
    """What the planner charges a scale-up and a scale-down: seconds paused, seconds at the old
    capacity (an in-place scale-up's ramp) and records replayed."""

    up_pause_s: float
    down_pause_s: float
    up_ramp_s: float
    replay_records: float


def planned_costs(kind: BackendKind, measured: Downtimes, restart_up_s: float, restart_down_s: float,
                  restart_replay_records: float) -> PlannedCosts:
    """A rescale's costs as the backend `kind` pays them: a restart pauses for the restart the caller
    expects in each direction and replays `restart_replay_records`; an in-place change costs what
    `in_place_cost` learned from `measured` (a scale-up's time until its executors registered, at the
    old capacity; a scale-down's hold), with nothing replayed."""
    if kind is BackendKind.IN_PLACE:
        ramp = in_place_cost(1, 2, measured, DEFAULT_RAMP_S, DEFAULT_DOWN_PAUSE_S).reduced_s
        hold = in_place_cost(2, 1, measured, DEFAULT_RAMP_S, DEFAULT_DOWN_PAUSE_S).pause_s
        return PlannedCosts(up_pause_s=0.0, down_pause_s=hold, up_ramp_s=ramp, replay_records=0.0)
    return PlannedCosts(restart_up_s, restart_down_s, 0.0, restart_replay_records)


def backend_in_use(configured: BackendKind, reported: str | None) -> tuple[BackendKind, str | None]:
    """The way the job is really rescaled: what its runner last reported, else what its configuration
    says; with a note for the decision's reason when they differ (a runner asked to change executors in
    place falls back to restarts where it cannot, e.g. in local mode)."""
    if reported is None or reported == configured.value:
        return configured, None
    actual = BackendKind(reported)
    why = " (it cannot change executors in place here, e.g. in local mode)" if actual is BackendKind.RESTART else ""
    return actual, (f"planned with {actual.value} costs: the job runner reports that it rescales this job by "
                    f"{actual.value}, not {configured.value} as configured{why}")

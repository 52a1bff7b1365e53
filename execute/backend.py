"""The scaling-backend seam: how a job's resources are actually changed.

The job runner (`execute.runner`) keeps what does not depend on how: one command per decision id,
fencing tokens, reports, restarting a job that died. A backend does the change itself and says
what it costs. Today's backend restarts the Spark query from its checkpoint at the new
parallelism (`pipeline.restart`); a backend that changes a running application's executors in
place implements the same protocol with `kind = BackendKind.IN_PLACE`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from contracts.plan_state import Downtimes

log = logging.getLogger(__name__)


class BackendKind(StrEnum):
    RESTART = "restart"  # stop, then start again from the checkpoint at the new parallelism
    IN_PLACE = "in_place"  # change the resources of the running job


class StartError(RuntimeError):
    """The job did not start (or change) to the requested parallelism."""


class RunnerFatal(RuntimeError):
    """The job runs at no parallelism: even the rollback failed."""


@dataclass(frozen=True)
class BackendOutcome:
    """What one change did: whether the target runs, what runs now, and the pause it caused."""

    ok: bool
    parallelism: int  # what runs now
    attempts: int
    errors: tuple[str, ...] = ()
    rolled_back_to: int | None = None
    downtime_s: float | None = None  # from the request until the job processes again
    ramp_s: float | None = None  # in place: from the request until the executors registered (or went)


@dataclass(frozen=True)
class ActionCost:
    """What one action is expected to cost the job, in seconds of its input.

    `pause_s`: no processing at all; `reduced_s`: processing below the target's capacity (an
    in-place change while new executors register); `replay_s`: input processed again (what was
    read since the last checkpoint)."""

    pause_s: float
    reduced_s: float = 0.0
    replay_s: float = 0.0


class ScalingBackend(Protocol):
    """One way of changing a job's parallelism. Not thread-safe: the runner drives it from one thread."""

    kind: BackendKind

    @property
    def parallelism(self) -> int | None:
        """What the job runs at; None before it started."""
        ...

    def start(self, parallelism: int) -> float:
        """Start the job at `parallelism`; the seconds until it processed. Raises StartError."""
        ...

    def apply(self, target: int) -> BackendOutcome:
        """Change the running job to `target`, falling back to what ran if that fails. Raises
        RunnerFatal when the job runs at no parallelism afterwards."""
        ...

    def expected_cost(self, current: int, target: int, measured: Downtimes) -> ActionCost:
        """What changing `current` -> `target` is expected to cost, learned from the downtimes this
        backend measured (`measured`, per direction)."""
        ...

    def healthy(self) -> bool: ...

    def failure(self) -> str | None:
        """Why the job stopped, when it did."""
        ...

    def stop(self) -> None: ...


def restart_cost(current: int, target: int, measured: Downtimes, default_s: float,
                 checkpoint_interval_s: float) -> ActionCost:
    """A restart from the checkpoint: the longest recent measured restart in that direction (the
    default until one is measured), and up to a checkpoint interval of input replayed."""
    if target == current:
        return ActionCost(pause_s=0.0)
    direction = "up" if target > current else "down"
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
        return ActionCost(pause_s=0.0, reduced_s=measured.expected("up", default_ramp_s))
    return ActionCost(pause_s=measured.expected("down", default_pause_s))


def rescale_with_rollback(start: Callable[[int], object], target: int, last_good: int, retries: int) -> BackendOutcome:
    """Start `target`, trying 1 + retries times; failing that, start `last_good` the same way.

    `start` raises StartError when a parallelism does not come up. Raises RunnerFatal when neither
    starts. (A restarting backend's `apply`, after it stopped the job.)"""
    errors: list[str] = []
    attempts = 0
    for candidate, is_target in ((target, True), (last_good, False)):
        if not is_target and candidate == target:
            break
        for _ in range(1 + max(0, retries)):
            attempts += 1
            try:
                start(candidate)
            except StartError as exc:
                errors.append(f"parallelism {candidate}: {exc}")
                log.warning("start at parallelism %d failed: %s", candidate, exc)
                continue
            if is_target:
                return BackendOutcome(True, candidate, attempts, tuple(errors))
            return BackendOutcome(False, candidate, attempts, tuple(errors), rolled_back_to=candidate)
    raise RunnerFatal("; ".join(errors))

"""The scaling-backend seam: how a job's resources are actually changed.

The job runner (`execute.runner`) keeps what does not depend on how: one command per decision id,
fencing tokens, reports, restarting a job that died. A backend does the change itself and says
what it costs. Today's backend restarts the Spark query from its checkpoint at the new
parallelism (`pipeline.restart`); a backend that changes a running application's executors in
place (`pipeline.inplace`) implements the same protocol with `kind = BackendKind.IN_PLACE`. What an
action costs, per kind, is in `contracts.backends`: the planner plans with the same figures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from contracts.backends import ActionCost, BackendKind
from contracts.plan_state import Downtimes

log = logging.getLogger(__name__)


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

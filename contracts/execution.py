"""What execute keeps between messages: the holder of a job's execution lock and its rescale in flight.

Execute takes a job's lock (a fencing token that grows with every acquisition, and the decision that
holds it) before it sends the job runner a command, tracks the rescale in flight until the runner's
report or the timeout ends it, then frees the lock. The knowledge base stores both
(`knowledge.protocols.Fencing`); the kernel (`execute.kernel`) only ever sees these types.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from contracts.messages import Parallelism
from contracts.plan_state import Direction


class LockHolder(NamedTuple):
    """Who holds a job's execution lock: its fencing token and the decision that took it."""

    token: int
    decision_id: str


class InFlight(BaseModel):
    """The rescale of one job that execute sent to the job runner and that has not ended yet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision_id: str = Field(description="The decision being executed; the runner's report names it.")
    from_parallelism: Parallelism = Field(description="The decision's parallelism before the rescale.")
    to_parallelism: Parallelism = Field(description="The parallelism the runner was asked for.")
    token: int = Field(description="The lock's fencing token the command carried; the lock is freed with it.")
    deadline: float = Field(description="Wall time (epoch s) by which the runner must have answered, else "
                                        "the rescale fails as overdue.")

    @property
    def direction(self) -> Direction:
        return Direction.of(self.from_parallelism, self.to_parallelism)

"""A fleet's contracts: a cluster's slot budget, a job's bid for slots on it, and what it was granted.

A cluster is registered with its capacity (`ClusterConfig`); jobs name it (`JobConfig.cluster`). Each
job planned on a cluster bids (`FleetBid`) and is granted slots (`FleetGrant`) by the fleet step
(`plan.fleet`); the bids and the slots each job holds are kept per cluster in knowledge
(`FleetState`), so every plan worker allocates from the same view.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

CLUSTER_NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
MAX_CURVE = 10_000  # slots a curve may cover: a bid beyond it is refused, not stored


class ClusterConfig(BaseModel):
    """A cluster's capacity: `workers` x `slots_per_worker` executor slots (cores) shared by its jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=CLUSTER_NAME)
    workers: int = Field(ge=1, le=100_000)
    slots_per_worker: int = Field(ge=1, le=10_000)

    @property
    def budget(self) -> int:
        return self.workers * self.slots_per_worker


class FleetBid(BaseModel):
    """One job's bid, made each window it is planned: the slots it `holds` (running, or a rescale's
    larger side while one is in flight), what its own plan `wants`, what its arrivals `need` now (the
    fewest slots whose capacity carries the planned rate), its bounds and weight, and `costs[k]`: what
    holding `minimum + k` slots over the planning horizon costs it (`plan.fleet.hold_costs`), for every
    k up to `wants - minimum`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(min_length=1, max_length=256)
    holds: int = Field(ge=0)
    wants: int = Field(ge=1)
    need: int = Field(ge=1)
    minimum: int = Field(ge=1)
    weight: float = Field(gt=0, le=100)
    costs: list[float] = Field(max_length=MAX_CURVE)
    at: float = 0.0  # the window end it was made at

    @model_validator(mode="after")
    def _consistent(self) -> FleetBid:
        if self.wants < self.minimum or len(self.costs) != self.wants - self.minimum + 1:
            raise ValueError("a bid wants at least its minimum, with one cost per slot count from minimum to wants")
        return self

    def cost(self, slots: int) -> float:
        """Its cost at `slots` (minimum..wants)."""
        return self.costs[slots - self.minimum]


class Move(BaseModel):
    """Slots one job gave way with for another that waits for them: opened by the giver's grant (its
    window end `at` names the move), closed by the receiver's grant of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    giver: str
    receiver: str
    slots: int = Field(ge=1)
    at: float


class FleetState(BaseModel):
    """A cluster's fleet as knowledge keeps it: every job's latest bid, the slots each holds or was
    granted (reserved: never more, summed, than the budget) and the moves open (slots given way for a
    job that has not taken them yet), and when each job was last granted more slots (metric time)."""

    model_config = ConfigDict(extra="forbid")

    bids: dict[str, FleetBid] = Field(default_factory=dict)
    held: dict[str, int] = Field(default_factory=dict)
    moves: list[Move] = Field(default_factory=list)
    grown_at: dict[str, float] = Field(default_factory=dict)

    def without(self, job_id: str) -> FleetState:
        """The fleet with the job's bid, held slots and moves dropped (the job was unregistered)."""
        return FleetState(bids={j: b for j, b in self.bids.items() if j != job_id},
                          held={j: h for j, h in self.held.items() if j != job_id},
                          moves=[m for m in self.moves if job_id not in (m.giver, m.receiver)],
                          grown_at={j: t for j, t in self.grown_at.items() if j != job_id})


class FleetGrant(BaseModel):
    """What the fleet step granted one job: `granted` slots now (within what the others hold), its share
    `allocated` when the others have moved, the cluster's `budget`, the `price` of a slot where the budget
    binds (slot-seconds over the horizon the last slot given saves; None where the arrivals alone exceed
    the budget and slots are shared by weight), the jobs that gave way (granted less than they want), and
    the moves it opened or closed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str
    budget: int
    granted: int
    allocated: int
    binds: bool
    price: float | None = None
    gave_way: list[str] = Field(default_factory=list)
    short: list[str] = Field(default_factory=list)  # jobs granted less than their arrivals need
    # A move, one coordinated action over two jobs' decisions: the moves this grant opened (the job gives
    # way for others) or closed (the job takes the slots others gave way with).
    moves: list[Move] = Field(default_factory=list)

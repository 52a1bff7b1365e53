"""`recovered` events: only for a recovery from a rescale this autoscaler executed. A parallelism change
it did not make (recommend mode, where nothing is executed; an operator's restart) is timed by analyze
but reported by no event."""

from __future__ import annotations

import asyncio

from contracts.analyses import RecoveryView
from contracts.decisions import EventType, ScalingEvent
from contracts.plan_state import PlanState
from contracts.settings import Settings
from execute.agent import ExecuteAgent
from knowledge import MemoryKnowledge
from plan.agent import PlanAgent
from plan.kernel import decide
from tests.unit.test_ds2 import analysis, config

# The job stopped at 264 s at 2 slots and was back to normal 30 s later at 4.
RECOVERY = RecoveryView(started_at=264.0, observed_s=30.0, judge="backlog", from_parallelism=2, to_parallelism=4)
RECOVERED = analysis(window_end=300.0, parallelism=4, recovery=RECOVERY)


def codes(state: PlanState, mode: str) -> list[str]:
    _, plan = decide(state, RECOVERED, config(mode=mode))
    return [n.code for n in plan.notices]


def test_a_recovered_notice_only_after_a_rescale_execute_carried_out() -> None:
    # Execute recorded the end of the rescale to 4 slots (281 s), after the job stopped (264 s).
    executed = PlanState().after_rescale(4, 281.0, 17.0, "up")
    assert "recovered" in codes(executed, "auto")
    # Also when the job was switched to recommend mode since: the rescale did run.
    assert "recovered" in codes(executed, "recommend")
    # Recommend mode: nothing was executed, so execute recorded no rescale.
    assert "recovered" not in codes(PlanState(), "recommend")
    # An operator's restart at 264 s, after the autoscaler's last rescale (to 4 slots, ended at 200 s).
    assert "recovered" not in codes(PlanState().after_rescale(4, 200.0, 17.0, "up"), "auto")
    # The autoscaler's last rescale ended after the stop but left the job at another parallelism.
    assert "recovered" not in codes(PlanState().after_rescale(3, 281.0, 17.0, "up"), "auto")


def test_a_recommend_mode_job_gets_no_recovered_event_through_plan_and_execute() -> None:
    """The whole path: plan's decision for the window that reports the recovery, executed by execute."""

    async def run() -> list[ScalingEvent]:
        settings = Settings()
        knowledge = MemoryKnowledge(settings)
        await knowledge.register_job("job", {"mode": "recommend"})
        published: list[tuple[str, bytes]] = []

        async def publish(topic: str, key: str, value: bytes) -> None:
            published.append((topic, value))

        plan, execute = PlanAgent(settings, knowledge, publish), ExecuteAgent(settings, knowledge, publish)
        await plan.plan(RECOVERED.to_bytes())
        for topic, value in list(published):
            if topic == "decisions":
                await execute.apply(value)
        return [ScalingEvent.model_validate_json(v) for t, v in published if t == "scaling_events"]

    events = asyncio.run(run())
    assert [e for e in events if e.type is EventType.RECOVERED] == []

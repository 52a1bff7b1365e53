"""The subscriber's dedup (`infra.subscribe`): each decision and event once, in a bounded memory."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.decisions import Action, DecisionReason, EventType, ScalingDecision, ScalingEvent
from execute.agent import event_id
from infra.subscribe import Once, SeenIds

ids = st.lists(st.sampled_from([f"id{i}" for i in range(20)]), max_size=200)


@given(ids)
def test_with_room_for_every_id_each_passes_once_in_order_of_first_sight(seen: list[str]) -> None:
    memory = SeenIds(memory=20)
    passed = [key for key in seen if memory.first(key)]
    assert passed == list(dict.fromkeys(seen))


@given(ids, st.integers(1, 8))
def test_memory_is_bounded_and_a_repeat_within_it_is_dropped(seen: list[str], size: int) -> None:
    memory = SeenIds(memory=size)
    recent: list[str] = []  # the last `size` distinct ids, most recent last: what the memory must hold
    for key in seen:
        assert memory.first(key) == (key not in recent)
        recent = [*(k for k in recent if k != key), key][-size:]
        assert len(memory) <= size


def test_memory_must_hold_something() -> None:
    with pytest.raises(ValueError):
        SeenIds(memory=0)


def decision(window_end: float) -> ScalingDecision:
    return ScalingDecision(job_id="job", window_end=window_end, action=Action.NONE, from_parallelism=2,
                           to_parallelism=2, policy="default", target_utilization=0.7,
                           reason=DecisionReason(code="hold", message="hold"), closed_at=window_end)


def test_a_republished_decision_and_a_repeated_event_are_dropped_and_nothing_else() -> None:
    once = Once()
    first, second = decision(10.0), decision(20.0)
    # A crash republishes the committed decision: the same bytes, so the same decision_id.
    again = ScalingDecision.model_validate_json(first.to_bytes())
    started = ScalingEvent(event_id=event_id(first.decision_id, "started"), decision_id=first.decision_id,
                           job_id="job", type=EventType.STARTED, from_parallelism=2, to_parallelism=3)
    # Execute emits the same step again after a crash: a new message, the same event id.
    restarted = started.model_copy(update={"timestamp": started.timestamp + 5})
    outcome = started.model_copy(update={"event_id": event_id(first.decision_id, "outcome"),
                                         "type": EventType.COMPLETED})
    stream = [first, second, again, started, restarted, outcome]
    assert [m for m in stream if once.first(m)] == [first, second, started, outcome]
    assert once.repeats == 2


def test_decisions_and_events_are_told_apart_even_with_equal_ids() -> None:
    once = Once()
    d = decision(10.0)
    e = ScalingEvent(event_id=d.decision_id, decision_id=d.decision_id, job_id="job", type=EventType.NOTICE,
                     from_parallelism=2, to_parallelism=2)
    assert once.first(d) and once.first(e)


def test_the_subscriber_needs_no_faust() -> None:
    code = "import sys, infra.subscribe; assert 'faust' not in sys.modules, 'imports faust'"
    subprocess.run([sys.executable, "-c", code], check=True)

"""The simulator's loop (`evaluation.loop`): the recorded stream's rescales are the ones it decides,
whether a window closes at its end (the simulator, which recorded it) or on the next window's first
report (the monitor, as `Loops` replays it)."""

from __future__ import annotations

from contracts.settings import Settings
from tests.support.replay import JOBS, in_process, load


def test_the_replayed_stream_gets_the_rescales_that_were_recorded() -> None:
    groups = load(0.0)
    # The simulator recorded the stream with windows on multiples of the interval: replayed the same way.
    loops, counts = in_process(groups, Settings(window_spread=False))
    for job in JOBS:
        recorded = [step["running"] for group in groups for step in group.answers if step["job"] == job]
        assert [command.to_parallelism for command in loops.jobs[job].commands] == recorded
        assert [event.type.value for event in loops.jobs[job].events
                if event.type.value in ("started", "completed")] == ["started", "completed"] * len(recorded)
    assert sorted(letter.reason for letter in loops.dead_letters) == ["malformed_json", "unknown_job"]
    # Every window that closed got a decision: each job's windows but its last (still open) and those
    # it spent restarting without a report.
    assert counts[-1].decisions == {job: len(loops.jobs[job].recent) for job in JOBS}


def test_a_window_is_decided_once_and_in_order() -> None:
    loops, _ = in_process(load(0.0), Settings())
    for job in JOBS:
        ends = [d.window_end for d in loops.decisions if d.job_id == job]
        assert ends == sorted(set(ends))

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline import offsets as off


def test_json_round_trip_uses_string_keys() -> None:
    assert off.to_json_offsets({1: 5, 0: 3}) == {"0": 3, "1": 5}
    assert off.from_json_offsets({"0": 3, "1": 5}) == {0: 3, 1: 5}
    assert off.from_json_offsets(None) == {}


def test_parse_progress_offsets_reads_both_formats() -> None:
    assert off.parse_progress_offsets('{"0": 10, "1": 20}') == {0: 10, 1: 20}
    assert off.parse_progress_offsets('{"orders": {"0": 10, "1": 20}}') == {0: 10, 1: 20}
    assert off.parse_progress_offsets({"0": 7}) == {0: 7}
    for junk in (None, "", "null", "not json", "[1, 2]"):
        assert off.parse_progress_offsets(junk) == {}


def test_available_end_never_goes_behind_start() -> None:
    # Partition 0 lost data (broker restart), partition 2 is new.
    assert off.available_end({0: 100, 1: 5}, {0: 40, 1: 9, 2: 3}) == {0: 100, 1: 9, 2: 3}


def test_cap_end_offsets_without_limit_reads_everything() -> None:
    assert off.cap_end_offsets({0: 0, 1: 10}, {0: 50, 1: 20}, None) == {0: 50, 1: 20}
    assert off.cap_end_offsets({0: 0, 1: 10}, {0: 50, 1: 20}, 100) == {0: 50, 1: 20}


def test_cap_end_offsets_shares_the_limit_by_lag() -> None:
    end = off.cap_end_offsets({0: 0, 1: 0}, {0: 300, 1: 100}, 100)
    assert end == {0: 75, 1: 25}


def test_cap_end_offsets_hands_out_the_remainder() -> None:
    end = off.cap_end_offsets({0: 0, 1: 0, 2: 0}, {0: 10, 1: 10, 2: 10}, 10)
    assert sum(end.values()) == 10
    assert all(3 <= v <= 4 for v in end.values())


@given(
    lags=st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    limit=st.integers(0, 50_000),
)
def test_cap_end_offsets_properties(lags: list[int], limit: int) -> None:
    start = {p: 1000 * p for p in range(len(lags))}
    latest = {p: start[p] + lag for p, lag in enumerate(lags)}
    end = off.cap_end_offsets(start, latest, limit)
    assert off.count_records(start, end) == min(limit, sum(lags))
    assert all(start[p] <= end[p] <= latest[p] for p in start)


def test_plan_splits_without_min_partitions_is_one_task_per_partition() -> None:
    plans = off.plan_splits({0: 0, 1: 5, 2: 7}, {0: 10, 1: 5, 2: 9}, None)
    assert plans == [[off.Segment(0, 0, 10)], [off.Segment(2, 7, 9)]]


def test_plan_splits_makes_equal_tasks_across_partitions() -> None:
    plans = off.plan_splits({0: 0, 1: 0}, {0: 10, 1: 2}, 3)
    assert [sum(s.size for s in plan) for plan in plans] == [4, 4, 4]
    assert plans[1] == [off.Segment(0, 4, 8)]
    assert plans[2] == [off.Segment(0, 8, 10), off.Segment(1, 0, 2)]


def test_plan_splits_with_fewer_records_than_tasks() -> None:
    plans = off.plan_splits({0: 0}, {0: 2}, 8)
    assert plans == [[off.Segment(0, 0, 1)], [off.Segment(0, 1, 2)]]
    assert off.plan_splits({0: 5}, {0: 5}, 4) == []


@given(
    sizes=st.lists(st.integers(0, 500), min_size=1, max_size=8),
    min_partitions=st.integers(1, 40),
)
def test_plan_splits_covers_every_offset_once(sizes: list[int], min_partitions: int) -> None:
    start = {p: 17 * p for p in range(len(sizes))}
    end = {p: start[p] + size for p, size in enumerate(sizes)}
    plans = off.plan_splits(start, end, min_partitions)
    read = [(s.partition, o) for plan in plans for s in plan for o in range(s.start, s.end)]
    expected = [(p, o) for p in sorted(start) for o in range(start[p], end[p])]
    assert sorted(read) == expected
    total = sum(sizes)
    assert len(plans) == min(min_partitions, total)
    task_sizes = [sum(s.size for s in plan) for plan in plans]
    if task_sizes:
        assert max(task_sizes) - min(task_sizes) <= 1


def test_backlog_and_arrival_rate() -> None:
    assert off.backlog({0: 100, 1: 50}, {0: 90, 1: 50}) == 10
    assert off.backlog({0: 100, 1: 50}, {0: 120}) == 50  # ahead counts as none; missing as all
    assert off.arrival_rate({0: 100, 1: 50}, {0: 150, 1: 60}, 2.0) == 30.0
    assert off.arrival_rate({0: 100}, {0: 90}, 2.0) == 0.0
    assert off.arrival_rate({}, {0: 90}, 2.0) == 0.0
    assert off.arrival_rate({0: 1}, {0: 90}, 0.0) == 0.0

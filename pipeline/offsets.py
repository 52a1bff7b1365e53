"""Pure helpers over Kafka offset maps (partition -> offset); no I/O.

An offset map names, per partition, the next offset to read. The Spark source keeps these maps in
its checkpoint as JSON objects with string keys ({"0": 120, "1": 98}), so that a restart with any
parallelism resumes from the same place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OffsetMap = dict[int, int]


@dataclass(frozen=True)
class Segment:
    """Records [start, end) of one Kafka partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    """The checkpointed form: JSON object keys must be strings."""
    return {str(p): int(o) for p, o in sorted(offsets.items())}


def from_json_offsets(offsets: Mapping[str, Any] | None) -> OffsetMap:
    return {int(p): int(o) for p, o in (offsets or {}).items()}


def parse_progress_offsets(text: str | Mapping[str, Any] | None) -> OffsetMap:
    """Offsets as a StreamingQueryProgress shows them, from this source or from Spark's kafka source.

    Our source reports {"0": 12}; Spark's native source nests by topic ({"topic": {"0": 12}}).
    Anything else (None, empty, unparsable) is an empty map.
    """
    if text is None:
        return {}
    if isinstance(text, str):
        text = text.strip()
        if not text:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            return {}
    else:
        data = text
    if not isinstance(data, Mapping):
        return {}
    result: OffsetMap = {}
    for key, value in data.items():
        if isinstance(value, Mapping):  # native format: one level per topic
            for p, o in value.items():
                if _is_int(p) and _is_int(o):
                    result[int(p)] = result.get(int(p), 0) + int(o)
        elif _is_int(key) and _is_int(value):
            result[int(key)] = int(value)
    return result


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def merge_new_partitions(start: Mapping[int, int], latest: Mapping[int, int]) -> OffsetMap:
    """`start` extended by partitions that appeared since; a new partition is read from offset 0."""
    merged = dict(start)
    for p in latest:
        merged.setdefault(p, 0)
    return merged


def available_end(start: Mapping[int, int], latest: Mapping[int, int]) -> OffsetMap:
    """Where a read from `start` may end: the log end, never behind `start`.

    A log end behind the start means the broker lost data (an in-memory broker restarted); we then
    hold at the start rather than go back and re-read offsets already processed.
    """
    merged = merge_new_partitions(start, latest)
    return {p: max(o, latest.get(p, o)) for p, o in merged.items()}


def cap_end_offsets(start: Mapping[int, int], end: Mapping[int, int], max_records: int | None) -> OffsetMap:
    """Limit the range start..end to at most `max_records` records in total.

    As Spark's kafka source does, the allowance is shared in proportion to each partition's lag
    (largest remainders get the leftover records), so a lagging partition is not starved.
    """
    start = merge_new_partitions(start, end)
    lags = {p: max(0, end.get(p, o) - o) for p, o in start.items()}
    total = sum(lags.values())
    if max_records is None or total <= max_records:
        return {p: start[p] + lags[p] for p in start}
    budget = max(0, max_records)
    shares = {p: budget * lag / total for p, lag in lags.items()}
    take = {p: int(share) for p, share in shares.items()}
    leftover = budget - sum(take.values())
    for p in sorted(lags, key=lambda q: (shares[q] - take[q], lags[q], -q), reverse=True):
        if leftover <= 0:
            break
        if take[p] < lags[p]:
            take[p] += 1
            leftover -= 1
    return {p: start[p] + take[p] for p in start}


def count_records(start: Mapping[int, int], end: Mapping[int, int]) -> int:
    start = merge_new_partitions(start, end)
    return sum(max(0, end.get(p, o) - o) for p, o in start.items())


def plan_splits(start: Mapping[int, int], end: Mapping[int, int], min_partitions: int | None) -> list[list[Segment]]:
    """Split the records start..end into read tasks.

    Without `min_partitions`, one task per Kafka partition that has records (Spark's default).
    With it, exactly `min_partitions` tasks of near-equal size (fewer if there are fewer records);
    a task may cover pieces of several Kafka partitions. Equal tasks matter: with N task slots, N
    equal tasks finish in one wave, whereas Spark's per-partition splitting would leave a straggler
    wave whenever the split count is not a multiple of N.
    """
    start = merge_new_partitions(start, end)
    segments = [
        Segment(p, start[p], end.get(p, start[p])) for p in sorted(start) if end.get(p, start[p]) > start[p]
    ]
    if not segments:
        return []
    if not min_partitions or min_partitions < 1:
        return [[s] for s in segments]
    total = sum(s.size for s in segments)
    tasks = min(min_partitions, total)
    # Task i takes the records with global index in [bounds[i], bounds[i + 1]).
    bounds = [total * i // tasks for i in range(tasks + 1)]
    plans: list[list[Segment]] = [[] for _ in range(tasks)]
    position = 0  # global index of the first record of the current segment
    task = 0
    for seg in segments:
        offset = seg.start
        while offset < seg.end:
            while bounds[task + 1] <= position + (offset - seg.start):
                task += 1
            room = bounds[task + 1] - (position + (offset - seg.start))
            upto = min(seg.end, offset + room)
            plans[task].append(Segment(seg.partition, offset, upto))
            offset = upto
        position += seg.size
    return plans


# ---------------------------------------------------------------- source metrics from offset maps


def backlog(latest: Mapping[int, int], processed: Mapping[int, int]) -> int:
    """Records in the log not yet processed: log end minus processed end, never negative."""
    return sum(max(0, end - processed.get(p, 0)) for p, end in latest.items())


def arrival_rate(previous: Mapping[int, int], current: Mapping[int, int], seconds: float) -> float:
    """Log growth per second between two log-end maps (a shrinking log counts as no growth)."""
    if seconds <= 0 or not previous:
        return 0.0
    grown = sum(max(0, end - previous.get(p, 0)) for p, end in current.items())
    return grown / seconds

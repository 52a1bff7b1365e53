"""Measures of a Spark job changing its executors in place: its micro-batches' spans and pauses, when
it drained, and whether every input record came out exactly once. `python -m bench.inplace_live` and
tests/integration/test_inplace_cluster.py use them."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from evaluation.calibrate import INPUT, OUTPUT
from infra.kafka import TopicReader, written_ids
from pipeline.inplace import InPlaceExecutors


def batch_spans(progress: list[Any], seen: dict[int, tuple[float, float]]) -> None:
    """Each micro-batch's (start, end) in epoch seconds by batch id, from the query's recent progress."""
    from pipeline.metrics import sample_from_progress

    for item in progress:
        batch = item["batchId"] if isinstance(item, dict) else item.batchId
        sample = sample_from_progress(item)
        if sample.input_rows > 0:  # an idle progress event (no data) is no batch
            seen[int(batch)] = (sample.trigger_start, sample.trigger_start + sample.duration_s)


def pauses(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each time with no micro-batch running, (from, seconds): one batch's end to the next one's start."""
    ordered = sorted(spans)
    return [(a[1], b[0] - a[1]) for a, b in itertools.pairwise(ordered)]


def longest_pause(spans: list[tuple[float, float]]) -> float:
    return max((seconds for _, seconds in pauses(spans)), default=0.0)


def watch(job: InPlaceExecutors, seconds: float, seen: dict[int, tuple[float, float]]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert job.query is not None
        batch_spans(list(job.query.recentProgress), seen)
        time.sleep(1.0)


def drained(job: InPlaceExecutors, seen: dict[int, tuple[float, float]], timeout_s: float = 300.0) -> bool:
    """Wait (the load stopped) until the job admitted everything in its input, noting its batches."""
    from pipeline import offsets as off
    from pipeline.metrics import sample_from_progress

    after = time.time() + 3.0  # the load generator's last records reach the broker
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert job.query is not None
        batch_spans(list(job.query.recentProgress), seen)
        last = job.query.lastProgress
        if last is not None:
            sample = sample_from_progress(last)
            if sample.trigger_start > after and sample.log_end and off.backlog(sample.log_end, sample.processed) == 0:
                return True
        time.sleep(1.0)
    return False


def ids_once(bootstrap: str, timeout_s: float = 180.0) -> dict[str, int]:
    """Input ids against output ids: how many were lost, how many duplicated."""
    source = TopicReader(bootstrap, INPUT)
    while True:  # until a second brings nothing new
        before = len(source.values)
        if len(source.poll(1.0)) == before:
            break
    produced = {json.loads(v)["id"] for v in source.values}
    source.close()
    out = written_ids(bootstrap, OUTPUT, produced, timeout_s)
    lost = sorted(produced - set(out))
    return {"input": len(produced), "output": len(out), "lost": len(lost), "lost_ids": lost[:5] + lost[-5:],
            "duplicated": len(out) - len(set(out)), "unexpected": len(set(out) - produced)}

"""In-place rescaling on a real Spark standalone cluster (started from the pyspark wheel): the demo
job's executors go 2 -> 1 -> 2 under load without restarting its query, no micro-batch waits long,
and every record comes out exactly once; asked for 3 on the cluster's 2 cores, it reports the 2 it
got as a partial grant, after a retry."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import pytest

from capacity.live_testbed import Adjustable
from contracts.plan_state import Downtimes
from evaluation.calibrate import background_load, job_config, own_broker
from pipeline.inplace import InPlaceExecutors
from stack.cluster import start_cluster
from tests.support.inplace import drained, ids_once, longest_pause, watch

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_executors_change_in_place_with_no_restart_no_long_pause_and_every_record_once() -> None:
    seen: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, own_broker() as bootstrap:
        cluster = start_cluster(cores=2, memory="2g", log_dir=Path(tmp) / "cluster")
        try:
            assert cluster.alive_cores() == 2
            config = job_config(bootstrap, {"cost_ms": "4"}, Path(tmp) / "job", master=cluster.url)
            # At most 3 executors, one more than the cluster's cores; a shortfall is retried once, after 5 s.
            job = InPlaceExecutors(dataclasses.replace(config, retries=1), max_parallelism=3, register_timeout_s=5.0)
            with background_load(bootstrap, Adjustable(rate_per_s=150.0), 2, duration_s=3600):
                job.start(2)
                assert job.query is not None and job.control is not None
                run_id = str(job.query.runId)
                assert len(job.control.executor_ids()) == 2
                watch(job, 4, seen)
                asked = time.time()
                down = job.apply(1)
                assert down.ok and down.parallelism == 1, down
                assert down.downtime_s is not None and down.downtime_s < 5.0, down
                assert job.control.executor_ids() == ["0"]  # the oldest executor stays
                assert job.reporter is not None and job.reporter.parallelism == 1
                watch(job, 5, seen)
                up = job.apply(2)
                assert up.ok and up.parallelism == 2 and up.downtime_s == up.ramp_s, up
                assert len(job.control.executor_ids()) == 2 and job.reporter.parallelism == 2
                short = job.apply(3)  # the cluster has 2 cores
                assert not short.ok and short.parallelism == 2 and short.attempts == 2, short
                assert short.errors == ("attempt 1: the cluster granted 2 of 3 executors",
                                        "attempt 2: the cluster granted 2 of 3 executors"), short
                assert len(job.control.executor_ids()) == 2 and job.reporter.parallelism == 2
                done = time.time()
                watch(job, 4, seen)
            assert drained(job, seen, timeout_s=120), "the job did not catch up after the load stopped"
            assert str(job.query.runId) == run_id, "the query was restarted"
            learned = Downtimes(up=[up.downtime_s or 0.0], down=[down.downtime_s or 0.0])
            assert job.expected_cost(1, 2, learned).reduced_s == up.ramp_s
            assert job.expected_cost(2, 1, learned).pause_s < 5.0
            job.stop()
            spans = sorted(seen.values())
            # The batches seen cover both rescales, and no time without a batch lasted over 5 s.
            assert spans and spans[0][0] < asked and spans[-1][1] > done, (asked, done, spans)
            assert longest_pause(spans) <= 5.0, spans
            counts = ids_once(bootstrap)
        finally:
            cluster.stop()
    assert counts["input"] > 1000 and counts["lost"] == counts["duplicated"] == counts["unexpected"] == 0, counts


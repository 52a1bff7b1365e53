"""What a worker killed under load cost (tests/support/load.takeover), by example."""

from __future__ import annotations

from tests.support.load import Takeover, takeover


def test_takeover_counts_lost_and_repeated_windows_and_the_gap_across_the_kill() -> None:
    decided = {
        # Decided on time throughout, one decision published twice (a redelivery).
        "a": [(10.0, 5.0), (20.0, 15.0), (20.0, 16.0), (30.0, 25.0), (40.0, 35.0)],
        # Its worker killed at 20: nothing from 15 to 45, and the window ending at 30 never decided.
        "b": [(10.0, 5.0), (20.0, 15.0), (40.0, 45.0)],
    }
    expected = {"a": [10.0, 20.0, 30.0, 40.0], "b": [10.0, 20.0, 30.0, 40.0]}
    assert takeover(decided, expected, killed_at=20.0, interval_s=10.0) == Takeover(
        windows_lost=1, decisions_repeated=1, jobs_interrupted=1, longest_gap_s=20.0, median_gap_s=20.0)


def test_no_gap_no_loss_when_every_job_goes_on() -> None:
    decided = {"a": [(10.0, 5.0), (20.0, 15.0), (30.0, 25.0)]}
    assert takeover(decided, {"a": [10.0, 20.0, 30.0]}, killed_at=18.0, interval_s=10.0) == Takeover(0, 0, 0, 0.0, 0.0)


def test_the_cpu_meter_says_which_part_used_the_cores() -> None:
    import os
    import subprocess
    import sys
    import time

    import psutil

    from tests.support.load import CpuMeter

    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    try:
        meter = CpuMeter({"busy": [busy.pid], "sleeping": [idle.pid], "gone": [gone.pid], "parent": [os.getpid()],
                          "parent alone": [os.getpid()]}, alone=("parent alone",))
        gone.kill()
        gone.wait()
        time.sleep(1.5)
        cores = meter.stop()
    finally:
        for process in (busy, idle):
            process.kill()
            process.wait()
    # Relative figures: the unit tests share the cores (xdist), so a busy loop gets what is left of one.
    assert cores["busy"] > 0.15 and cores["busy"] > 5 * cores["sleeping"], cores
    assert "gone" not in cores  # a part that went has no figure
    # the busy child counts with its parent only
    assert cores["parent"] >= 0.9 * cores["busy"] and cores["parent alone"] < 0.5 * cores["busy"], cores
    assert 0 <= cores["idle"] <= (psutil.cpu_count() or 1), cores  # the machine's idle cores


def test_decision_latency_counts_each_windows_first_decision() -> None:
    from tests.support.load import decision_latencies

    decided = {  # (window end, published at, closed at)
        "a": [(10.0, 11.5, 11.0), (20.0, 21.5, 21.0), (20.0, 40.0, 21.0)],  # republished 19 s later: not a wait
        "b": [(10.0, 14.0, 11.0)],
    }
    assert decision_latencies(decided) == {"p50": 0.5, "p99": 2.95, "max": 3.0}
    assert decision_latencies({}) == {}

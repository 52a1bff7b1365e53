"""The live capacity testbed: the demo Spark job on its own broker, steps measured between micro-batch
starts, told sustained from not (StreamBed's MST step, live)."""

from __future__ import annotations

import pytest

from capacity.live_testbed import OVERLOAD, LiveTestbed

pytestmark = [pytest.mark.spark, pytest.mark.integration]

COST_MS = 4.0  # 250 records per busy second per slot at most: the overload (400 rec/s) is beyond one slot


def test_the_live_testbed_measures_one_slots_ceiling_and_tells_sustained_from_not() -> None:
    warm_rate = 100.0
    with LiveTestbed({"cost_ms": str(COST_MS)}, measure_s=10.0) as testbed:
        ceiling = testbed.warm_up(warm_rate, 15.0, overload_s=12.0)
        # One slot cannot take the overload (1000 / COST_MS at most, less its costs per batch), and
        # took the warm-up's rate.
        assert warm_rate < ceiling < min(OVERLOAD * warm_rate, 1000.0 / COST_MS)
        under = testbed.run(1, 0.7 * ceiling)
        # It drains what the overload left, admitting more than is injected.
        assert under.sustained and under.processed >= 0.99 * under.injected and under.backlog_growth <= 0
        over = testbed.run(1, 1.3 * ceiling)
        assert not over.sustained and over.backlog_growth > 0
        # Saturated, it admits what one slot can: no less than under the warm-up's overload (less 10 % of
        # run-to-run spread; Spark's cost per batch still falls over a process's first minutes, so later
        # steps admit up to 13 % more, seen in CI), and never more than 1000 / COST_MS.
        assert 0.9 * ceiling <= over.processed < min(over.injected, 1000.0 / COST_MS)
        assert testbed.runs == 3 and not testbed.restarts

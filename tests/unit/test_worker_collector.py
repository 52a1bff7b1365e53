"""An agent worker tunes Python's garbage collector at start (`agent.cli.tune_collector`): what start-up
made is frozen, collections run less often, and cyclic garbage made later is still collected on its own.
Run in a child process, so the test runner's own collector keeps its settings."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, weakref
from agent.cli import GC_THRESHOLDS, tune_collector

class Node:
    pass

frozen_before = gc.get_freeze_count()
tune_collector()
first = None
for i in range(200_000):  # cycles dropped at once: only the collector can free them
    node = Node()
    node.self = node
    if first is None:
        first = weakref.ref(node)
    del node
print(json.dumps({"thresholds": list(gc.get_threshold()), "expected": list(GC_THRESHOLDS),
                  "frozen_before": frozen_before, "frozen": gc.get_freeze_count(),
                  "first_cycle_collected": first() is None}))
"""


def test_the_worker_freezes_start_up_collects_less_often_and_still_frees_cycles() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["thresholds"] == probe["expected"]
    assert probe["expected"][0] > 700  # less often than Python's default
    assert probe["frozen"] > probe["frozen_before"]
    assert probe["first_cycle_collected"], "cyclic garbage must still be collected without an explicit call"

"""The evaluation writes the same numbers as before the restructuring that moved it into its own package.

tests/data/evaluate_before_move.json holds, per trace and noise seed (2 h of load each), every
policy's slot-seconds, actions, seconds beyond the backlog target, lag, final backlog and
capacity error, and the oracle's figures, as the code before the move computed them (the default
policy was called `ours` there). A change that means to change these numbers replaces the file
and says why in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evaluation.suite import EVALUATED, EvalSettings, evaluate_trace

STORED = json.loads((Path(__file__).parents[1] / "data" / "evaluate_before_move.json").read_text())
RENAMED = {"ours": "default"}


@pytest.mark.parametrize("key", sorted(STORED))
def test_every_policy_and_the_oracle_compute_what_they_computed_before(key: str) -> None:
    trace, seed = key.split("/")
    result = evaluate_trace(trace, list(EVALUATED), EvalSettings(hours=2.0, seed=int(seed)))
    runs = {row["policy"]: row for row in result["runs"]}
    before: dict[str, Any] = STORED[key]
    assert {RENAMED.get(name, name) for name in before["runs"]} == set(runs)
    for name, measures in before["runs"].items():
        now = runs[RENAMED.get(name, name)]
        assert {k: now[k] for k in measures} == measures, name
    assert {k: result["oracle"][k] for k in before["oracle"]} == before["oracle"]
    assert result["static_parallelism"] == before["static_parallelism"]

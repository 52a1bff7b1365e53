"""The command line loads the scientific stack (scipy, scikit-learn, pandas) only for the commands that
use it: an agent worker or `jobs register` starts in about a second, without 250 MB it never uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("sklearn", "scipy.stats", "pandas", "capacity.cli", "evaluation.cli")
PROBE = """
import json, sys
from agent.cli import _mount_commands, command_names
_mount_commands(sys.argv[2:])
loaded = [m for m in sys.argv[1].split(",") if m in sys.modules]
print(json.dumps({"loaded": loaded, "commands": sorted(command_names())}))
"""


def mounted(*argv: str) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *argv], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [("agents", "--stage", "plan"), ("jobs", "register", "x"), ("dashboard",)])
def test_a_light_command_loads_no_heavy_module(argv: tuple[str, ...]) -> None:
    probe = mounted(*argv)
    assert probe["loaded"] == [], probe
    assert "capacity" not in probe["commands"] and "evaluate" not in probe["commands"]


def test_a_heavy_command_mounts_itself_only_and_help_mounts_all() -> None:
    capacity = mounted("capacity", "plan", "--rate", "10")
    assert "capacity" in capacity["commands"] and "evaluate" not in capacity["commands"], capacity
    assert "sklearn" in capacity["loaded"]
    job = mounted("job", "run")
    assert "job" in job["commands"] and job["loaded"] == [], job
    everything = mounted("--help")
    assert {"job", "load", "evaluate", "calibrate", "capacity", "bench", "agents"} <= set(everything["commands"])
    # A command that does not exist is told so against the full list.
    assert "capacity" in mounted("nonsense")["commands"]

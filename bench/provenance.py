"""Where a benchmark's numbers come from: which code measured them."""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The files whose change changes what the planning and forecasting benchmarks measure.
MEASURED = ("plan/step.py", "plan/guarded.py", "plan/controls.py", "plan/ds2.py", "plan/proactive.py",
            "contracts/jobs.py", "analyze/true_rates.py", "analyze/forecast.py", "monitor/windows.py",
            "evaluation/simulator.py", "evaluation/jobmodel.py")


def code_version(files: tuple[str, ...] = MEASURED) -> dict[str, Any]:
    """The commit, which of `files` differ from it, and their hashes (results must say which code
    they measured)."""
    info: dict[str, Any] = {"sha256": {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest()[:16]
                                       for f in files if (ROOT / f).exists()}}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        run: dict[str, Any] = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 10}
        info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], **run).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--", *files], **run).stdout
        info["uncommitted"] = [line[3:] for line in status.splitlines()]
    return info

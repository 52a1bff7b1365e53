"""`autoscaler capacity plan --job` seeds a registered job's knowledge (a real Redis) with the planned
capacity, `autoscaler capacity show` compares it with what the planner measured, and an unknown job
is refused before any testbed time is spent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from contracts.jobs import parse_planned_capacity
from contracts.settings import Settings, settings_env
from knowledge import RedisKnowledge
from stack.services import register_jobs

pytestmark = pytest.mark.integration


def autoscaler(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True,
                          env=settings_env(settings) | {"PATH": "", "COLUMNS": "200"}, timeout=120)


def planned_config(settings: Settings, job: str) -> tuple[dict[int, float], float]:
    """The job's planned capacity (parsed) and its error, as stored."""
    async def run() -> tuple[str, float]:
        knowledge = RedisKnowledge(settings)
        try:
            stored = await knowledge.job_config(job)
        finally:
            await knowledge.close()
        return stored.planned_capacity, stored.planned_capacity_error

    curve, error = asyncio.run(run())
    return parse_planned_capacity(curve), error


def test_a_plan_seeds_the_jobs_knowledge_and_show_compares_it(settings: Settings, tmp_path: Path) -> None:
    job = f"planned-{uuid.uuid4().hex[:6]}"
    register_jobs(settings, [job], max_parallelism="12")
    out = tmp_path / "plan.json"
    planned = autoscaler(settings, "capacity", "plan", "--truth", "linear", "--rate", "1000", "--job", job,
                         "--out", str(out))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    capacity, error = planned_config(settings, job)
    assert sorted(capacity) == list(range(1, 13))  # up to the job's max_parallelism
    assert capacity[12] == pytest.approx(1200, rel=0.1) and 0.05 <= error < 1  # 100 rec/s per slot, linear
    shown = autoscaler(settings, "capacity", "show", job)
    assert shown.returncode == 0, shown.stderr
    assert "planned against observed" in shown.stdout
    rows = {line.split()[1]: line.split()[3] for line in shown.stdout.splitlines()
            if line.startswith("│") and line.split()[1].isdigit()}
    assert rows["1"] == f"{capacity[1]:,.0f}" and rows["8"] == f"{capacity[8]:,.0f}"  # nothing measured yet

    unknown = autoscaler(settings, "capacity", "plan", "--truth", "linear", "--rate", "1000", "--job",
                         f"nobody-{uuid.uuid4().hex[:6]}", "--out", str(tmp_path / "x.json"))
    assert unknown.returncode == 2 and "not registered" in unknown.stdout + unknown.stderr
    assert not (tmp_path / "x.json").exists()  # refused before the testbed ran


def test_an_executor_profile_plan_seeds_the_jobs_knowledge_at_whole_executors(settings: Settings,
                                                                               tmp_path: Path) -> None:
    """`capacity profiles --job`: the chosen profile's executors, k of them at k x cores slots, each carrying
    what the forest predicts for one; the Spark settings for that profile are printed."""
    job = f"profiled-{uuid.uuid4().hex[:6]}"
    register_jobs(settings, [job], max_parallelism="12")
    out = tmp_path / "profiles.json"
    planned = autoscaler(settings, "capacity", "profiles", "--rate", "3000", "--job", job, "--out", str(out))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = json.loads(out.read_text())["plan"]
    per_executor = plan["predicted"] / plan["executors"]
    capacity, error = planned_config(settings, job)
    cores = plan["cores"]
    assert sorted(capacity) == list(range(cores, 13, cores))
    for slots, rate in capacity.items():
        assert rate == pytest.approx(slots // cores * per_executor, abs=0.1)
    band = (plan["high"] - plan["low"]) / (2 * plan["predicted"])
    assert error == pytest.approx(max(0.05, band), abs=1e-3)
    memory_mb = round(plan["memory_gb"] * 1024)
    assert f"spark.executor.cores={cores} --conf spark.executor.memory={memory_mb}m" in planned.stdout

    unknown = autoscaler(settings, "capacity", "profiles", "--rate", "3000", "--job",
                         f"nobody-{uuid.uuid4().hex[:6]}", "--out", str(tmp_path / "x.json"))
    assert unknown.returncode == 2 and "not registered" in unknown.stdout + unknown.stderr
    assert not (tmp_path / "x.json").exists()  # refused before the testbed ran

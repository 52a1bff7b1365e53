"""End to end: `autoscaler demo` (the default policy, the real Spark demo job) watched on its dashboard in
headless Chromium; the README's screenshot of a job's page is the one this test takes.

The demo runs as `./dev demo` runs it (its own stack agents, job, load and dashboard), on a shorter
shape (120, 560, then 120 rec/s) with 5-s windows; its drain waits for the screenshot (at most its 90 s),
as its dashboard stops with it. Once the scale-down after the drop has completed,
the job's page must show the agents as ok, both rescales, and the rates chart's y axis on the measured
rates, the forecast the planner does not trust drawn apart and clipped rather than stretching the
axis; a recovery must have been timed against its prediction. The screenshot goes to
docs/images/dashboard-job.png, so the README's picture is the last run's."""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import agent.demo
from agent.demo import JOB, run_demo
from contracts.settings import Settings
from knowledge import with_knowledge
from tests.browser import chromium
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.browser]

LOW, HIGH = 120, 560
SHAPE = f"steps:{LOW}:50,{HIGH}:120,{LOW}:100"  # `./dev demo`'s 120:90,560:240,120:150, shorter
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard-job.png"


def test_the_demo_on_its_dashboard(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_STATE_DIR", str(tmp_path / "state"))  # the demo's stack state, logs, job
    settings = settings.model_copy(update={"loop_interval_s": 5.0})
    output = io.StringIO()
    pictured = threading.Event()
    follow = agent.demo._follow

    def held(*args: Any) -> Any:
        """The demo's drain ends on the first empty backlog once the load is done: not before the picture."""
        analysis = follow(*args)
        return analysis if pictured.is_set() else None

    monkeypatch.setattr(agent.demo, "_follow", held)
    summary: dict[str, Any] = {}
    demo = threading.Thread(target=lambda: summary.update(run_demo(
        settings, SHAPE, 4.0, 4, 8, Console(file=output, width=200, color_system=None))), daemon=True)
    started = time.time()
    demo.start()
    try:
        url = wait_until(lambda: re.search(r"dashboard: (http://\S+/jobs/demo)", output.getvalue()), 120,
                         message="the demo's dashboard").group(1)

        def scaled_down() -> dict[str, Any] | None:
            events = with_knowledge(settings, lambda k: k.events(JOB, 20))
            return next((e for e in events if e["type"] == "completed" and e["timestamp"] > started
                         and e["to_parallelism"] < e["from_parallelism"]), None)

        down = wait_until(scaled_down, 420, interval=1.0, message=f"the scale-down; demo output:\n{output.getvalue()}")
        with chromium(height=1000) as driver:
            driver.get(url)
            shown = wait_until(lambda: (driver.execute_script("return window.dashboard") or {}).get(
                "lastWindowEnd", 0) > down["timestamp"] + 10 and driver.execute_script("return window.dashboard"),
                30, message="the windows after the scale-down on the page")
            agents = wait_until(lambda: driver.execute_script("return window.dashboard.agents"), 10,
                                message="the agents' health")
            assert [a["status"] for a in agents] == ["ok"], agents
            rates = driver.execute_script("""
                const u = window.dashboardCharts.rates;
                return {min: u.scales.y.min, max: u.scales.y.max,
                        names: u.series.map(s => s.label), data: u.data.slice(1)};""")
            measured = [v for label in ("arrival rate", "processed rate", "predicted capacity")
                        for v in rates["data"][rates["names"].index(label) - 1] if v is not None]
            # The y axis is on the measured rates; whatever the forecast does beyond them is clipped.
            assert rates["min"] == 0 and rates["max"] == pytest.approx(1.1 * max(measured)), rates
            assert shown["ratesRange"] == [0, pytest.approx(1.1 * max(measured))]
            assert max(measured) > HIGH * 0.8, measured  # the step is on the chart
            # Right after the drop the level has shifted: the planner's forecast has not earned trust again.
            assert shown["series"]["forecast_untrusted"] > 0 and shown["series"]["forecast"] == 0, shown["series"]
            assert "not trusted" in driver.find_element("css selector", ".forecast-note").text
            parallelism = driver.execute_script("return window.dashboardCharts.parallelism.data[1]")
            assert max(p for p in parallelism if p is not None) >= 3 > parallelism[-1], parallelism
            assert "unreachable" not in driver.find_element("id", "agents").text
            driver.execute_script("window.scrollTo(0, 0)")
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            assert driver.save_screenshot(str(SCREENSHOT)) and SCREENSHOT.stat().st_size > 10_000
    finally:
        pictured.set()
        demo.join(timeout=300)
    assert not demo.is_alive(), output.getvalue()
    # The demo itself: one action per load change (one scale-up for the step, one scale-down after the
    # drop, none failed), every record once.
    assert summary["scale_ups"] == 1 and summary["scale_downs"] == 1 and summary["failed"] == 0, output.getvalue()
    assert summary["missing"] == summary["duplicates"] == 0, output.getvalue()
    # The last rescale's recovery was timed (the demo drains until it is) and compared with the recovery
    # predicted when it was decided. (The scale-up's is often cut short by the scale-down after the drop.)
    assert any(r["predicted_s"] is not None and r["observed_s"] is not None for r in summary["recoveries"]), \
        output.getvalue()

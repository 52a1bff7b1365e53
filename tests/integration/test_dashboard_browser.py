"""The dashboard in a real browser: real broker, Redis and agents, `autoscaler dashboard`, headless Chromium.

The charts must draw what the agents hold in Redis on time axes that span its windows (in seconds, one
recovery point too) and a rates axis on the measured rates, a new decision must appear without a reload, the
job list must load in under a second with 1,000 registered jobs, an unknown job must get a 404 page
with the jobs, and an agent the dashboard cannot reach must show as unreachable."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from contracts.messages import MetricReport, SourceMetrics
from contracts.settings import Settings
from knowledge import with_knowledge
from stack.processes import free_port
from stack.services import AgentWorker, register_jobs, start_dashboard
from tests.browser import chromium
from tests.conftest import wait_until
from tests.integration.kafka_helpers import send

pytestmark = [pytest.mark.integration, pytest.mark.browser]

JOB = "clicks-enrich"
OTHER_JOBS = 1000
# Where the screenshots also go when set (the README's come from here).
SCREENSHOT_DIR = os.environ.get("AUTOSCALER_SCREENSHOT_DIR")


def reports(start: float, seconds: int) -> list[MetricReport]:
    """A job at one slot (1,000 rec/s) under 2,500-3,500 rec/s, then at four: its backlog grows, then drains."""
    backlog, out = 0.0, []
    for i in range(1, seconds + 1):
        slots = 1 if i <= 120 else 4
        arrival = 3000.0 + 500.0 * math.sin(2 * math.pi * i / 200)
        processed = min(1000.0 * slots, arrival + backlog)
        backlog = max(0.0, backlog + arrival - processed)
        out.append(MetricReport(
            job_id=JOB, timestamp=start + i, interval_s=1.0, parallelism=slots, records_in=int(processed),
            records_out=int(processed), busy_time_s=processed / 1000.0,
            source=SourceMetrics(arrival_rate=arrival, backlog=int(backlog), partitions=12)))
    return out


def publish(settings: Settings, batch: list[MetricReport]) -> None:
    send(settings, settings.topics.metrics, [(JOB.encode(), r.to_bytes()) for r in batch])


def state(driver: Any) -> dict[str, Any]:
    return driver.execute_script("return window.dashboard") or {}


def page_problem(driver: Any) -> str:
    """What the page says went wrong, and the browser's console, for a failure's message."""
    errors = driver.find_elements("id", "error")
    shown = errors[0].text if errors else ""
    return f"page error: {shown!r}; console: {driver.get_log('browser')}"


def wait_page(driver: Any, predicate: Any, timeout: float, message: str) -> Any:
    """`wait_until` on the page, saying what the page showed when it times out."""
    try:
        return wait_until(predicate, timeout, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {page_problem(driver)}; state: {state(driver)}") from None


def screenshot(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path)), f"no screenshot {name}"
    assert path.stat().st_size > 10_000
    if SCREENSHOT_DIR:
        Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(SCREENSHOT_DIR) / name)
    return path


def test_dashboard_draws_what_the_agents_hold_and_updates_live(
    settings: Settings, agents: AgentWorker, tmp_path: Path
) -> None:
    register_jobs(settings, [JOB], policy="reactive", mode="recommend", target_utilization="0.8",
                  stabilization_windows="0", min_samples="1", max_parallelism="8")
    register_jobs(settings, [f"job-{i:04d}" for i in range(OTHER_JOBS)])
    start = math.floor(time.time() / 10) * 10 - 400
    load = reports(start, 320)
    publish(settings, load[:301])  # 30 windows closed
    wait_until(lambda: len(with_knowledge(settings, lambda k: k.decisions(JOB, 50))) >= 30, 90,
               message="30 decisions")

    dead = f"http://127.0.0.1:{free_port()}"
    dashboard = start_dashboard(settings, tmp_path / "dashboard.log",
                                agents=[f"http://127.0.0.1:{agents.web_port}", dead])
    try:
        with chromium(height=1300) as driver:
            # The job list, with 1,001 jobs registered: paged, searchable, fast.
            driver.get(f"{dashboard.url}/")
            listed = wait_page(driver, lambda: state(driver).get("readyAt") and state(driver), 20, "the job list")
            registered = with_knowledge(settings, lambda k: k.jobs())  # other tests' jobs share this Redis
            assert len(registered) >= OTHER_JOBS + 1
            assert listed["total"] == len(registered) and listed["jobs"] == 50
            assert listed["readyAt"] < 1000, f"the job list took {listed['readyAt']:.0f} ms"
            agents_shown = wait_page(driver, lambda: state(driver).get("agents"), 10, message="the agents' health")
            assert {a["url"]: a["status"] for a in agents_shown} == {
                f"http://127.0.0.1:{agents.web_port}": "ok", dead: "unreachable"}
            assert "unreachable" in driver.find_element("id", "agents").text
            box = driver.find_element("id", "q")
            box.send_keys(JOB[:6])
            wait_page(driver, lambda: state(driver).get("total") == 1, 10, message="the search")
            assert JOB in driver.find_element("id", "jobs").text
            screenshot(driver, tmp_path, "dashboard-jobs.png")

            # The job's page draws exactly the analyses and decisions Redis holds.
            driver.get(f"{dashboard.url}/jobs/{JOB}")
            driver.execute_script("window.notReloaded = true")
            analyses = with_knowledge(settings, lambda k: k.analyses(JOB))
            shown = wait_page(driver, lambda: state(driver).get("windows") == len(analyses) and state(driver), 20,
                               message="the charts")
            assert len(driver.find_elements("css selector", "[data-chart] canvas")) == 4
            assert shown["series"]["arrival"] == shown["series"]["parallelism"] == len(analyses)
            assert shown["last"]["arrival"] == pytest.approx(analyses[0]["arrival_rate"])
            assert shown["last"]["backlog"] == analyses[0]["backlog"]
            assert shown["last"]["parallelism"] == analyses[0]["parallelism"]
            assert shown["series"]["backlog"] == shown["series"]["target"] == len(analyses)
            # Every time axis is in seconds and spans the job's windows (the rates chart's, the forecast too),
            # the recovery chart's also with a single point in it (one rescale).
            windows = sorted(a["window_end"] for a in analyses)
            driver.execute_script("""  // uPlot rescales after the script (a microtask): read the scales in the next
                const c = window.dashboardCharts;
                c.recovery.setData([[c.parallelism.data[0][3]], [25], [null]]);""")
            spans = driver.execute_script("""
                const c = window.dashboardCharts, spans = {};
                for (const key in c) spans[key] = [c[key].scales.x.min, c[key].scales.x.max];
                spans.forecastEnd = c.rates.data[0].at(-1);
                return spans;""")
            ahead = spans.pop("forecastEnd")  # the rates chart's forecast, drawn ahead of the last window
            assert windows[-1] <= ahead <= windows[-1] + 600
            assert spans == {"rates": [windows[0], ahead], **{key: [windows[0], windows[-1]]
                                                                for key in ("parallelism", "backlog", "recovery")}}
            assert shown["ratesRange"][1] == pytest.approx(1.1 * max(
                max(a["arrival_rate"], a["observed_processing_rate"], (a.get("capacity") or {}).get("current") or 0)
                for a in analyses))
            newest = with_knowledge(settings, lambda k: k.decisions(JOB, 1))[0]
            assert shown["lastDecision"]["t"] == newest["window_end"]
            assert shown["markers"] >= 1  # the saturated job's scale-ups (recommended) are marked
            driver.find_element("css selector", "#decisions tbody tr").click()
            assert newest["reason"]["code"] in driver.find_element("id", "detail").text
            # Pointing at the last decision mark shows that decision's reason.
            marked = driver.execute_script("""
                const u = window.dashboardCharts.parallelism;
                const i = u.data[2].findLastIndex(v => v !== null);
                u.setCursor({left: u.valToPos(u.data[0][i], "x"), top: 10});
                return u.data[0][i];""")
            assert driver.execute_script("return window.dashboard.shownDecision.t") == marked
            pointed = next(d for d in with_knowledge(settings, lambda k: k.decisions(JOB, 100))
                           if d["window_end"] == marked)
            rule_and_code = f"[{pointed['reason']['rule']}/{pointed['reason']['code']}]"
            assert rule_and_code in driver.find_element("id", "detail").text

            # More reports: the new decisions appear without a reload.
            publish(settings, load[301:])
            updated = wait_page(driver, lambda: (state(driver).get("lastWindowEnd") or 0) > shown["lastWindowEnd"]
                                 and state(driver), 60, message="a new window on the page")
            assert driver.execute_script("return window.notReloaded") is True
            assert updated["updates"] > shown["updates"]
            latest = with_knowledge(settings, lambda k: k.decisions(JOB, 1))[0]
            wait_page(driver, lambda: (state(driver).get("lastDecision") or {}).get("t") == latest["window_end"], 10,
                       message="the newest decision on the page")
            driver.execute_script("window.scrollTo(0, 0)")
            screenshot(driver, tmp_path, "dashboard-saturated-job.png")  # the README's is the demo's (tests/e2e)

            # An unknown job: a 404 page that lists the jobs.
            driver.get(f"{dashboard.url}/jobs/no-such-job")
            assert "No job no-such-job" in driver.find_element("tag name", "h1").text
            assert len(driver.find_elements("css selector", "#known li")) == 50
    finally:
        dashboard.stop()


def test_dashboard_says_when_knowledge_is_unreachable(settings: Settings, tmp_path: Path) -> None:
    nowhere = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    dashboard = start_dashboard(nowhere, tmp_path / "dashboard.log", agents=[])
    try:
        with chromium() as driver:
            driver.get(f"{dashboard.url}/")
            shown = wait_page(driver, lambda: driver.find_element("id", "error").text, 20, "the error")
            assert "knowledge (Redis) unreachable" in shown
            assert not driver.find_elements("css selector", "#jobs tbody tr")
            driver.get(f"{dashboard.url}/jobs/any")
            assert "knowledge (Redis) unreachable" in driver.find_element("tag name", "main").text
    finally:
        dashboard.stop()

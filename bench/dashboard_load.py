"""What the dashboard costs the agents: their CPU with and without the dashboard open in a browser.

Run `python -m bench.dashboard_load --help`. A tansu broker, redis-server and one agent worker (all four
stages) are started on free ports; `--jobs` jobs are registered and each sends one report per second
(the agents' real load, held near its target so no rescale traffic). The agents' CPU is measured over
three phases of `--phase-s` each: without the dashboard, with it (`autoscaler dashboard`, headless
Chromium on one job's page and a second window on the job list, both polling), and without it again.
The dashboard's cost is phase two minus the mean of the other two, in percent of one core.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from bench.common import RESULTS, process_cpu_seconds, table, write_result
from bench.ingest_setup import ALL_STAGES, console, make_report, producer, run_settings, services, start_worker
from contracts.settings import Settings
from infra.kafka import ensure_topics
from stack.services import register_jobs, start_dashboard
from tests.support.browser import chromium

app = typer.Typer(add_completion=False, help=__doc__)


class Reporter:
    """Every job's report each second, stamped with the wall clock, from a thread."""

    def __init__(self, settings: Settings, jobs: list[str]) -> None:
        self.settings, self.jobs = settings, jobs
        self.stopping = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="reports", daemon=True)

    def _run(self) -> None:
        p = producer(self.settings, linger_ms=20)
        rng = random.Random(0)
        tick = float(int(time.time()))
        while not self.stopping.is_set():
            tick += 1.0
            time.sleep(max(0.0, tick - time.time()))
            for job in self.jobs:
                p.produce(self.settings.topics.metrics, key=job.encode(), value=make_report(job, tick, rng))
            p.poll(0)
            self.sent += len(self.jobs)
        p.flush(30)

    def __enter__(self) -> Reporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(60)


def cpu_percent(pid: int, seconds: float) -> float:
    """The process's CPU over the next `seconds`, in percent of one core."""
    before = process_cpu_seconds(pid)
    time.sleep(seconds)
    return 100.0 * (process_cpu_seconds(pid) - before) / seconds


@app.command()
def main(
    jobs: Annotated[int, typer.Option(help="Registered jobs, one report per second each.")] = 100,
    phase_s: Annotated[float, typer.Option(help="Seconds measured per phase.")] = 60.0,
    warm_up_s: Annotated[float, typer.Option(help="Seconds of load before the first phase.")] = 30.0,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS / "dashboard_load.json",
) -> None:
    """Measure the agents' CPU without, with and again without the dashboard open."""
    names = [f"job-{i:04d}" for i in range(jobs)]
    with services(keep_logs=False) as (broker, redis, workdir):
        settings = run_settings(broker, redis, 0, 4, 10.0)
        ensure_topics(settings)
        register_jobs(settings, names, mode="recommend")
        worker = start_worker(settings, workdir, ALL_STAGES)
        phases: dict[str, float] = {}
        dashboard_cpu = browser_reads = 0.0
        ready_ms: dict[str, float] = {}
        try:
            with Reporter(settings, names) as reporter:
                console.print(f"{jobs} jobs at 1 report/s; warming up {warm_up_s:.0f} s")
                time.sleep(warm_up_s)
                phases["without"] = cpu_percent(worker.process.pid, phase_s)
                dashboard = start_dashboard(settings, workdir / "dashboard.log",
                                            agents=[f"http://127.0.0.1:{worker.web_port}"])
                try:
                    with chromium() as job_page, chromium() as job_list:
                        job_page.get(f"{dashboard.url}/jobs/{names[0]}")
                        job_list.get(f"{dashboard.url}/")
                        time.sleep(5)
                        ready_ms = {"job list": job_list.execute_script("return window.dashboard.readyAt"),
                                    "job page": job_page.execute_script("return window.dashboard.readyAt")}
                        start_dash = process_cpu_seconds(dashboard.process.pid)
                        updates = job_page.execute_script("return window.dashboard.updates")
                        phases["with the dashboard"] = cpu_percent(worker.process.pid, phase_s)
                        dashboard_cpu = 100 * (process_cpu_seconds(dashboard.process.pid) - start_dash) / phase_s
                        browser_reads = job_page.execute_script("return window.dashboard.updates") - updates
                finally:
                    dashboard.stop()
                phases["without, again"] = cpu_percent(worker.process.pid, phase_s)
                sent = reporter.sent
        finally:
            worker.stop()
    baseline = (phases["without"] + phases["without, again"]) / 2
    added = phases["with the dashboard"] - baseline
    result = table(f"{jobs} jobs, 1 report/s each, {phase_s:.0f} s a phase", "phase", "agents' CPU, % of one core")
    for name, value in phases.items():
        result.add_row(name, f"{value:.1f}")
    result.add_row("added by the dashboard", f"{added:+.1f} ({100 * added / baseline:+.1f} % of the agents' own)")
    result.add_row("the dashboard process itself", f"{dashboard_cpu:.1f}")
    console.print(result)
    console.print(f"the job page redrew {browser_reads} times in the measured phase; {sent:,} reports sent; "
                  f"first drawn after (ms): {ready_ms}")
    write_result(out, {"jobs": jobs, "phase_s": phase_s, "agents_cpu_percent": phases, "added_percent_points": added,
                       "added_relative": added / baseline, "dashboard_cpu_percent": dashboard_cpu,
                       "job_page_updates": browser_reads, "ready_ms": ready_ms, "reports_sent": sent},
                 ("agent/dashboard.py", "agent/dashboard_view.py"), console)


if __name__ == "__main__":
    app()

"""The one place that starts the autoscaler's processes: agent workers, a job runner, a load generator.

Every caller (the embedded stack, the demo, the live evaluation, the tests and the benchmarks)
starts them through these functions, with settings that reach the child through its environment
(`settings_env`; secrets never on a command line). The broker and Redis start with
`stack.processes.start_broker` / `start_redis`. `isolated_settings` gives a run topics, a consumer
group and a web port of its own on a shared broker and Redis.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any

from contracts.fleet import ClusterConfig
from contracts.settings import Settings, Topics, settings_env
from infra.security import redact
from infra.webauth import bearer_headers
from knowledge import RedisKnowledge
from stack.processes import free_port, spawn, stop_pid, wait_for_port

AGENT_START_TIMEOUT_S = 60.0


def _with_knowledge(settings: Settings, use: Callable[[RedisKnowledge], Awaitable[object]]) -> None:
    """Run `use` on a connection to the settings' knowledge base, closed afterwards."""

    async def run() -> None:
        knowledge = RedisKnowledge(settings)
        try:
            await use(knowledge)
        finally:
            await knowledge.close()

    asyncio.run(run())


def register_jobs(settings: Settings, jobs: list[str], forget: bool = False, **overrides: str) -> None:
    """Register `jobs` with the same overrides in the settings' knowledge base (reports of an
    unregistered job are dead-lettered); with `forget`, everything known about them goes first."""

    async def register(knowledge: RedisKnowledge) -> None:
        for job in jobs:
            if forget:
                await knowledge.unregister_job(job)
            await knowledge.register_job(job, overrides)

    _with_knowledge(settings, register)


def forget_jobs(settings: Settings, jobs: list[str]) -> None:
    """Unregister `jobs` from the settings' knowledge base with everything known about them (their reports
    are dead-lettered until they are registered again)."""

    async def forget(knowledge: RedisKnowledge) -> None:
        for job in jobs:
            await knowledge.unregister_job(job)

    _with_knowledge(settings, forget)


def register_cluster(settings: Settings, cluster: ClusterConfig) -> None:
    """Register (or resize) `cluster` in the settings' knowledge base, as `autoscaler cluster add` does."""
    _with_knowledge(settings, lambda knowledge: knowledge.register_cluster(cluster))


def autoscaler_argv(*args: str) -> list[str]:
    """The `autoscaler` command line, run with this interpreter."""
    return [sys.executable, "-m", "agent", *args]


def isolated_settings(broker_port: int, redis_port: int, topic_prefix: str, app_id: str,
                      loop_interval_s: float = 10.0, redis_db: int = 0) -> Settings:
    """Settings for a run's own topics (`<prefix>.<topic>`), consumer group and web port."""
    return Settings(
        kafka_bootstrap=f"127.0.0.1:{broker_port}", redis_url=f"redis://127.0.0.1:{redis_port}/{redis_db}",
        topics=Topics(**{k: f"{topic_prefix}.{v}" for k, v in Topics().model_dump().items()}),
        app_id=app_id, web_port=free_port(), loop_interval_s=loop_interval_s, topic_partitions=4,
    )


@dataclass
class AgentWorker:
    """One `autoscaler agents` process."""

    process: Popen[bytes]
    log_path: Path
    web_port: int
    stages: tuple[str, ...] = ()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        stop_pid(self.process.pid, timeout=15, process=self.process)


def start_agents(
    settings: Settings,
    log_path: Path,
    stages: list[str] | None = None,
    env: dict[str, str] | None = None,
    web_port: int | None = None,
    timeout: float = AGENT_START_TIMEOUT_S,
) -> AgentWorker:
    """An agent worker with `stages` (all four by default), returned once its /ready answers 200:
    Redis answers, the worker has its partitions (maybe none) and has fetched from them.

    It runs in the log's folder: Faust writes an `<app id>-data` folder where it runs."""
    port = web_port or int((env or {}).get("AUTOSCALER_WEB_PORT", settings.web_port))
    argv = autoscaler_argv("agents")
    for stage in stages or []:
        argv += ["--stage", stage]
    process = spawn("agents", argv, log_path,
                    {**settings_env(settings), **(env or {}), "AUTOSCALER_WEB_PORT": str(port)}, cwd=log_path.parent)
    worker = AgentWorker(process, log_path, port, tuple(stages or ()))
    try:
        wait_ready(port, settings, timeout, worker.alive)
    except (TimeoutError, RuntimeError) as exc:
        worker.stop()
        raise RuntimeError(f"the agents did not get ready: {exc}\n{worker.log()[-3000:]}") from None
    return worker


def start_together(starts: list[Callable[[], AgentWorker]]) -> list[AgentWorker]:
    """Start several workers at once, so their consumer-group joins overlap (one after the other,
    each waits for the group to rebalance again); all or none: if one fails, the others stop."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start) for start in starts]
    workers: list[AgentWorker] = []
    errors: list[BaseException] = []
    for future in futures:
        try:
            workers.append(future.result())
        except Exception as exc:
            errors.append(exc)
    if errors:
        for worker in workers:
            worker.stop()
        raise errors[0]
    return workers


def readiness(port: int, settings: Settings | None = None, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
    """An agent worker's /ready on 127.0.0.1:`port`, with the settings' token if any: (HTTP status,
    body); (0, the error) when nothing answers."""
    headers = bearer_headers(settings) if settings is not None else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/ready", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError) as exc:
        return 0, {"error": str(exc)}


def wait_ready(port: int, settings: Settings, timeout: float, alive: Callable[[], bool]) -> None:
    """Wait until the worker's /ready answers 200; RuntimeError if `alive()` turns false first."""
    deadline = time.monotonic() + timeout
    status, body = 0, {}
    while time.monotonic() < deadline:
        status, body = readiness(port, settings)
        if status == 200:
            return
        if not alive():
            raise RuntimeError("the worker exited")
        time.sleep(0.1)
    answer = f"{status or 'no answer'} {redact(json.dumps(body), settings)}"
    raise TimeoutError(f"not ready after {timeout:.0f} s; /ready: {answer}")


def _answering(port: int, timeout: float, stop: Callable[[], None], what: str, log_path: Path) -> None:
    """Wait until the port answers; else stop the process and raise with the end of its log."""
    try:
        wait_for_port("127.0.0.1", port, timeout=timeout)
    except TimeoutError:
        stop()
        raise RuntimeError(f"{what} did not start:\n{log_path.read_text(errors='replace')[-3000:]}") from None


@dataclass
class DashboardProcess:
    """One `autoscaler dashboard` process."""

    process: Popen[bytes]
    log_path: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_pid(self.process.pid, timeout=15, process=self.process)


def start_dashboard(settings: Settings, log_path: Path, agents: list[str] | None = None,
                    port: int | None = None, timeout: float = AGENT_START_TIMEOUT_S) -> DashboardProcess:
    """`autoscaler dashboard` on `port` (a free one by default), ready when the port answers."""
    port = port or free_port()
    argv = autoscaler_argv("dashboard", "--port", str(port))
    for url in agents or []:
        argv += ["--agent", url]
    dashboard = DashboardProcess(spawn("dashboard", argv, log_path, settings_env(settings)), log_path, port)
    _answering(port, timeout, dashboard.stop, "the dashboard", log_path)
    return dashboard


def start_job_runner(
    settings: Settings,
    job_id: str,
    checkpoint_dir: Path,
    log_path: Path,
    *,
    parallelism: int = 1,
    max_parallelism: int | None = None,
    options: dict[str, str] | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Popen[bytes]:
    """`autoscaler job run` for `job_id` (the demo job unless `args` name another `--entry`)."""
    argv = autoscaler_argv("job", "run", "--job-id", job_id, "--checkpoint-dir", str(checkpoint_dir),
                           "--parallelism", str(parallelism))
    if max_parallelism is not None:
        argv += ["--max-parallelism", str(max_parallelism)]
    for key, value in (options or {}).items():
        argv += ["--option", f"{key}={value}"]
    return spawn("runner", [*argv, *(args or [])], log_path, {**settings_env(settings), **(env or {})})


def wait_until_running(runner: Popen[bytes], log_path: Path, timeout: float = 120.0) -> float:
    """Wait until the job runner's log says the job runs; the seconds waited. A load that starts
    before would meet a backlog of Spark's start-up, not its own. RuntimeError if the runner exits
    first, TimeoutError after `timeout` seconds."""
    began = time.monotonic()
    while "runs at parallelism" not in (log_path.read_text() if log_path.exists() else ""):
        if runner.poll() is not None:
            raise RuntimeError(f"the job runner exited ({runner.returncode}) before the job ran; see {log_path}")
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"the job did not start within {timeout:.0f} s; see {log_path}")
        time.sleep(0.5)
    return time.monotonic() - began


def start_load(
    settings: Settings, topic: str, log_path: Path, load_args: list[str], partitions: int = 4,
    env: dict[str, str] | None = None,
) -> Popen[bytes]:
    """`autoscaler load run` into `topic` on the settings' broker; `load_args` give the shape or trace."""
    argv = autoscaler_argv("load", "run", *load_args, "--topic", topic, "--partitions", str(partitions),
                           "--bootstrap", settings.kafka_bootstrap, "--quiet")
    return spawn("load", argv, log_path, {**settings_env(settings), **(env or {})})

"""A live run: a Spark job under a load, autoscaled by the agents, with everything they publish.

Used by the live evaluation (`autoscaler evaluate --live`), the live benchmarks and the end-to-end
tests. The job is a `LiveWorkload` (the demo job unless told otherwise: its entry point, the records
its load sends, its options); callers above this layer build one from the workload registry
(`evaluation.live.live_workload`). The broker and Redis of the settings must be running; the agents,
the job runner and the load generator are started here (`stack.services`) and stopped at the end.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

from confluent_kafka import Consumer, Message

from contracts.analyses import Analysis
from contracts.decisions import EventType, ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import ensure_topics, group_consumer_config
from stack.processes import stop_pid
from stack.services import forget_jobs, register_jobs, start_agents, start_job_runner, start_load, wait_until_running

JOB = "demo"
WARM_UP_FIRST_ID = 1_000_000_000  # far above any replay's ids (they start at 0)
DEMO_ENTRY_POINT = "pipeline.demo:build"


@dataclass(frozen=True)
class LiveWorkload:
    """What `run_live` runs: the workload's name, its job entry point (module:function, pipeline.job),
    the records its load sends (`autoscaler load run --records`) and job options beside the per-record
    cost and the topics. Its topics are `<run>.<topic_name>.input` and `.output`."""

    name: str = "enrich"
    entry_point: str = DEMO_ENTRY_POINT
    records: str = "demo"
    options: tuple[tuple[str, str], ...] = ()

    @property
    def topic_name(self) -> str:
        return "demo" if self.name == "enrich" else self.name

    def load_args(self) -> list[str]:
        """The load generator's record arguments: none for demo records (its default)."""
        return [] if self.records == "demo" else ["--records", self.records]


ENRICH = LiveWorkload()


@dataclass
class LiveRun:
    started: float
    analyses: list[Analysis] = field(default_factory=list)
    decisions: list[ScalingDecision] = field(default_factory=list)
    events: list[ScalingEvent] = field(default_factory=list)
    load_summary: dict[str, object] = field(default_factory=dict)
    input_topic: str = ""
    output_topic: str = ""
    watched_s: float = 0.0  # the agents watched the job this long before the load (`run_live`)
    load_ended: float | None = None  # when the load finished (epoch seconds)

    def backlog_after(self, since: float) -> int | None:
        """The backlog of the last window that ended after `since`; None without one."""
        later = [a for a in self.analyses if a.window_end > since and a.backlog is not None]
        return max(later, key=lambda a: a.window_end).backlog if later else None

    def of(self, kind: EventType, since: float | None = None) -> list[ScalingEvent]:
        """The events of `kind`, those from `since` on (epoch seconds) if given."""
        return [e for e in self.events if e.type is kind and (since is None or e.timestamp >= since)]

    def rescales(self, kind: EventType, since: float | None = None, before: bool = False) -> list[ScalingEvent]:
        """The rescales' events of `kind` (`completed` or `failed`) whose rescale started from `since` on
        (epoch seconds), or `before` it: a rescale counts where it was decided, not where it ended, so one
        decided in a warm-up and finished after the load began is the warm-up's. Without `since`, all."""
        started = {e.decision_id: e.timestamp for e in self.of(EventType.STARTED)}
        events = self.of(kind)
        if since is None:
            return [] if before else events
        return [e for e in events if (started.get(e.decision_id, e.timestamp) < since) == before]

    def recovery_open(self) -> bool:
        """Whether the last rescale that completed has not been timed yet: no `recovered` event since."""
        completed = self.of(EventType.COMPLETED)
        return bool(completed) and not self.of(EventType.RECOVERED, max(e.timestamp for e in completed))

    def recoveries(self, since: float | None = None) -> list[dict[str, float | int | None]]:
        """Each observed recovery after a rescale, with the recovery time predicted when it was decided;
        with `since`, those whose rescale started from `since` on: a recovery counts where its rescale was
        decided, as `rescales` counts it, so a warm-up's rescale that recovers in the load is the warm-up's.
        Its rescale is the last one completed before it between the same parallelisms (a recovery event
        comes with a later window's decision, not with its rescale's)."""
        started = {e.decision_id: e.timestamp for e in self.of(EventType.STARTED)}
        completed = sorted(self.of(EventType.COMPLETED), key=lambda e: e.timestamp)
        rows: list[dict[str, float | int | None]] = []
        for e in self.of(EventType.RECOVERED):
            rescale = next((c for c in reversed(completed) if c.timestamp <= e.timestamp
                            and (c.from_parallelism, c.to_parallelism) == (e.from_parallelism, e.to_parallelism)), None)
            began = e.timestamp if rescale is None else started.get(rescale.decision_id, rescale.timestamp)
            if since is None or began >= since:
                rows.append({"at_s": round(e.timestamp - self.started, 1), "from": e.from_parallelism,
                             "to": e.to_parallelism, "predicted_s": e.numbers.get("predicted_s"),
                             "observed_s": e.numbers.get("observed_s"), "error_s": e.numbers.get("error_s")})
        return rows

    def decision_rows(self, since: float) -> list[dict[str, object]]:
        """Every decision, holds too, with the numbers the policy planned with: its window's end in
        seconds from `since` (the load's start: the simulator's clock), to compare window by window."""
        return [{"at_s": round(d.window_end - since, 1), "action": d.action.value, "from": d.from_parallelism,
                 "to": d.to_parallelism, "code": d.reason.code, "message": d.reason.message,
                 "numbers": d.reason.numbers} for d in sorted(self.decisions, key=lambda d: d.window_end)]

    def timeline(self) -> str:
        t0 = self.started
        lines = [(e.timestamp - t0, f"event {e.type.value} {e.from_parallelism}->{e.to_parallelism} "
                  f"downtime={e.downtime_s or ''} {e.error or ''} {json.dumps(e.numbers) if e.numbers else ''}")
                 for e in self.events]
        lines += [(a.window_end - t0, f"window p={a.parallelism} valid={a.valid} arrival={a.arrival_rate or 0:.0f} "
                   f"backlog={a.backlog} processed={a.observed_processing_rate:.0f} ds2={a.true_processing_rate:.0f} "
                   f"util={a.utilization:.2f} capacity={a.capacity.current if a.capacity else None} "
                   f"forecast={a.forecast.method if a.forecast else None}") for a in self.analyses]
        lines += [(d.timestamp - t0, f"decision {d.action.value} {d.from_parallelism}->{d.to_parallelism} "
                   f"[{d.reason.code}] {d.reason.message} {json.dumps(d.reason.numbers)}")
                  for d in self.decisions if d.action.value != "none"]
        return "\n".join(f"{t:7.1f} {text}" for t, text in sorted(lines))


def run_live(
    settings: Settings,
    workdir: Path,
    load_args: list[str],
    job_overrides: dict[str, str],
    max_parallelism: int = 8,
    cost_ms: float = 4.0,
    drain_s: float = 40.0,
    catch_up_s: float = 0.0,
    stages: list[str] | None = None,
    job: str = JOB,
    warm_up_s: float = 0.0,
    warm_up_rate: float = 50.0,
    watched_s: float = 0.0,
    runner_args: list[str] | None = None,
    parallelism: int = 1,
    workload: LiveWorkload = ENRICH,
) -> LiveRun:
    """Run the job under the load until the load ends plus `drain_s`; collect what was published.
    With `catch_up_s`, the drain goes on up to that much longer until a window after the load's end
    shows no backlog (the job has read all its input: what it has not written by then is lost, not late).

    With `warm_up_s`, the job first runs that long at `warm_up_rate` records/s before it is registered
    (the agents dead-letter its reports until then, so they learn nothing from it): Spark's cost per
    micro-batch falls over a new process's first minutes (docs/spark.md), which a job in production
    has long behind it but a replay compressed into minutes would magnify. Warm-up records have ids
    from WARM_UP_FIRST_ID on. With `watched_s` (at most `warm_up_s`) the job is registered that long
    before the warm-up ends, its load going on: the agents have measured the job at its base load when
    the load's pattern begins, as they would have a job in production (what they publish then is kept
    too, and `LiveRun.watched_s` says so).
    `runner_args` go to `autoscaler job run` (a cluster's `--master`, the
    `--backend`, Spark `--conf`s, a `--report-interval`: by default half the agents' window), which
    starts the job at `parallelism`. `workload` says which job
    runs and what its load sends (default the demo job and its records); its entry point is added to
    the runner's allowed entry points. The broker and Redis of `settings` must be running. The job is new:
    what the knowledge base knew of a job of that name (an earlier run's, on the same Redis) is forgotten
    when it is registered."""
    if not 0 <= watched_s <= max(warm_up_s, 0.0):
        raise ValueError(f"watched_s must be within 0..warm_up_s ({warm_up_s:g}), not {watched_s:g}")
    run = settings.topics.metrics.split(".")[0]
    input_topic, output_topic = f"{run}.{workload.topic_name}.input", f"{run}.{workload.topic_name}.output"
    if workload.entry_point not in settings.job_entry_points:
        settings = settings.model_copy(
            update={"job_entry_points": [*settings.job_entry_points, workload.entry_point]})
    if workload.entry_point != DEMO_ENTRY_POINT:
        runner_args = [*(runner_args or []), "--entry", workload.entry_point]
    if "--report-interval" not in (runner_args or []):
        runner_args = [*(runner_args or []), *report_interval(settings)]
    load_args = [*load_args, *workload.load_args()]
    ensure_topics(settings, extra=[input_topic, output_topic])
    config = {"max_parallelism": str(max_parallelism), **job_overrides}
    if warm_up_s <= 0:
        register_jobs(settings, [job], forget=True, **config)
    else:  # registered when the agents start watching; an earlier run's job of the same id is forgotten now
        forget_jobs(settings, [job])
    # From the earliest offset: the topics are this run's own, and nothing may be missed.
    follow = Consumer(group_consumer_config(settings.kafka_bootstrap, f"bench-{uuid.uuid4().hex[:8]}", "earliest"))
    follow.subscribe([settings.topics.analyses, settings.topics.decisions, settings.topics.scaling_events])
    agents = start_agents(settings, workdir / "agents.log", stages, timeout=90)
    runner = start_job_runner(settings, job, workdir / "job", workdir / "runner.log", max_parallelism=max_parallelism,
                              options={**dict(workload.options), "cost_ms": str(cost_ms), "input_topic": input_topic,
                                       "output_topic": output_topic}, args=runner_args, parallelism=parallelism)
    load: Popen[bytes] | None = None
    try:
        # The load comes to a running job, as it would to a job in production (whose start-up is not scaled).
        wait_until_running(runner, workdir / "runner.log")
        result = LiveRun(started=time.time(), input_topic=input_topic, output_topic=output_topic)
        keep = Keeper(settings, job, result)
        if warm_up_s > 0:
            warm_up(settings, input_topic, workdir, warm_up_s, warm_up_rate, follow, workload.load_args(),
                    watch=(watched_s, lambda: register_jobs(settings, [job], forget=True, **config), keep))
        load = start_load(settings, input_topic, workdir / "load.log", load_args)
        result.started, result.watched_s = time.time(), watched_s if warm_up_s > 0 else 0.0
        while True:
            keep(follow.poll(0.2))
            now = time.time()
            if result.load_ended is None:
                if load.poll() is not None:
                    result.load_ended = now
                continue
            if now >= result.load_ended + drain_s + catch_up_s or (
                    now >= result.load_ended + drain_s and result.backlog_after(result.load_ended) == 0):
                break
        result.load_summary = load_summary(workdir / "load.log")
    finally:
        for process in (load, runner):
            if process is not None:
                stop_pid(process.pid, timeout=60, process=process)
        agents.stop()
        follow.close()
    return result


class Keeper:
    """Keeps what the agents publish about `job` in a `LiveRun`, each message once (a consumer that
    rejoins its group reads again from its last commit)."""

    def __init__(self, settings: Settings, job: str, into: LiveRun) -> None:
        self.job = job
        self.parsers: dict[str, tuple[type[Analysis] | type[ScalingDecision] | type[ScalingEvent], list[Any]]] = {
            settings.topics.analyses: (Analysis, into.analyses),
            settings.topics.decisions: (ScalingDecision, into.decisions),
            settings.topics.scaling_events: (ScalingEvent, into.events)}
        self.seen: set[tuple[str, int, int]] = set()

    def __call__(self, msg: Message | None) -> None:
        if msg is None or msg.error() or msg.topic() not in self.parsers:
            return
        model, into = self.parsers[msg.topic()]
        item = model.model_validate_json(msg.value())
        key = (msg.topic(), msg.partition(), msg.offset())
        if item.job_id == self.job and key not in self.seen:
            self.seen.add(key)
            into.append(item)


def report_interval(settings: Settings) -> list[str]:
    """The job runner's `--report-interval` for two reports per window, as a job in production gives its
    agents: a window with one report measures no backlog growth between reports."""
    return ["--report-interval", f"{settings.loop_interval_s / 2:g}"]


def warm_up_load(seconds: float, rate: float) -> list[str]:
    """The load generator's arguments for a warm-up: a constant `rate` for `seconds`, its records' ids
    from WARM_UP_FIRST_ID on."""
    return ["--shape", f"constant:{rate:g}", "--duration", f"{seconds:g}", "--start-id", str(WARM_UP_FIRST_ID)]


def load_summary(log_path: Path) -> dict[str, object]:
    """The load generator's summary, the last line of its log (JSON; its text where it is not)."""
    lines = log_path.read_text().strip().splitlines()
    if not lines:
        return {}
    try:
        return dict(json.loads(lines[-1]))
    except json.JSONDecodeError:
        return {"tail": lines[-1]}


def warm_up(settings: Settings, topic: str, workdir: Path, seconds: float, rate: float, follow: Consumer,
            record_args: list[str] | None = None,
            watch: tuple[float, Callable[[], None], Keeper] | None = None) -> None:
    """A constant `rate` into `topic` for `seconds` (`run_live`), one load, the follower kept polling
    meanwhile; `record_args` choose the records (the load generator's `--records`). `watch` = (seconds,
    register, keep): `register` is called that many seconds before the end (at the start if none), and
    from then on what the follower reads goes to `keep`."""
    load = start_load(settings, topic, workdir / "warm-up.log", [*warm_up_load(seconds, rate), *(record_args or [])])
    began = time.time()
    register_at = began + seconds - (watch[0] if watch else 0.0)
    keep: Keeper | None = None
    try:
        while load.poll() is None:
            if time.time() > began + seconds + 120:
                raise TimeoutError(f"the warm-up load did not end within {seconds + 120:.0f} s; see {workdir}")
            if watch is not None and keep is None and time.time() >= register_at:
                watch[1]()
                keep = watch[2]
            msg = follow.poll(0.2)  # polled so that its group membership stays alive
            if keep is not None:
                keep(msg)
    finally:
        stop_pid(load.pid, timeout=10, process=load)
    if load.returncode not in (0, None):
        raise RuntimeError(f"the warm-up load failed ({load.returncode}); see {workdir / 'warm-up.log'}")
    if watch is not None and keep is None:  # the load ended early: the job is registered all the same
        watch[1]()

"""One job's MAPE-K loop in one process: the stages' kernels, as the agents run them, without the topics.

The agents are shells around pure kernels (`monitor.kernel`, `analyze.kernel`, `plan.kernel`,
`execute.kernel`); this is the simulator's shell around the same kernels, for one job:

- monitor: `fold` takes the job's metric reports into its open window; `close` closes it at the
  window's end (a live monitor closes it on the next window's first report: the same window, later).
  A simulated job's windows start on multiples of the interval, on the trace's clock; `Loops`, fed the
  agents' records, spreads them as the monitor does (`window_spread`);
- analyze: `analyze` runs the kernel on the closed window with the learned state kept here and the
  forecast `forecaster` makes (None: no forecast), for a job whose policy plans with one;
- plan: `decide` runs the planner step and the decision on the plan state, which lives in an
  in-memory knowledge base (`knowledge.MemoryKnowledge`, the same behaviour as Redis), with the slot
  quota reserved there when one is set, or for a job on a cluster the fleet step run there on the
  cluster's state; decisions are committed there as plan commits them;
- execute: `execute` carries out a decision with execute's own steps and shell (the lock, the rescale
  in flight, the command, the events); `rescale_completed` is the job runner's answer, which ends
  the rescale and records it in the plan state. `rescaling` is execute's lock, as plan reads it.

Kept here rather than in knowledge, for speed, with the same meaning: the open window, the learned
state and the last 60 analyses (the fallback of an idle window, `last_valid_analysis`).

`Loops` runs many jobs' loops on one knowledge base, fed the records the agents read (the metric
topic's, with bad ones dead-lettered, and the runners' reports).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from analyze import kernel as analyze_kernel
from analyze.arima import ForecastConfig
from contracts.analyses import Analysis, ForecastView
from contracts.backends import BackendKind
from contracts.dead_letters import DeadLetter
from contracts.decisions import RescaleCommand, RunnerReport, RunnerStatus, ScalingDecision, ScalingEvent
from contracts.jobs import JobConfig
from contracts.messages import MetricReport, MetricWindow
from contracts.plan_state import PlanState
from contracts.settings import Settings
from contracts.stage import Incoming
from execute.agent import ExecuteAgent
from execute.kernel import COMMANDS
from knowledge.memory import MemoryKnowledge, run_now
from knowledge.protocols import FALLBACK_SCAN
from monitor import kernel as monitor_kernel
from monitor.windows import WindowState
from plan import kernel as plan_kernel
from plan.policy import ScalingPolicy

Forecaster = Callable[[MetricWindow, ForecastConfig], ForecastView | None]
"""The forecast analyze would publish for a window, given the forecaster's settings."""



class JobLoop:
    """One job's loop over the kernels (see the module docstring)."""

    def __init__(
        self,
        job_id: str,
        config: JobConfig,
        policy: ScalingPolicy | None = None,
        forecaster: Forecaster | None = None,
        interval_s: float = 10.0,
        quota: int | None = None,
        knowledge: MemoryKnowledge | None = None,
    ) -> None:
        self.job_id = job_id
        self.config = config
        self.policy = policy
        self.forecaster = forecaster
        self.interval_s = interval_s
        self.quota = quota
        self.knowledge = knowledge or MemoryKnowledge(Settings())
        self.open: WindowState | None = None
        self.learned = analyze_kernel.start_learned(config)
        self.recent: deque[Analysis] = deque(maxlen=FALLBACK_SCAN)
        self.executor = ExecuteAgent(self.knowledge.settings, self.knowledge, self._publish)
        self.sent: list[tuple[str, str, bytes]] = []
        self.events: list[ScalingEvent] = []  # what execute published, in order
        self.commands: list[RescaleCommand] = []

    # ------------------------------------------------------------------ monitor

    def fold(self, report: MetricReport, partition: int | None = None, offset: int | None = None
             ) -> list[MetricWindow]:
        """Fold one report into the open window; the windows it closed (a later window's report)."""
        record = Incoming(value=None, key=self.job_id.encode(), partition=partition, offset=offset)
        parsed = monitor_kernel.Parsed([(report, record)], [])
        windows = {self.job_id: self.open} if self.open is not None else {}
        folded = monitor_kernel.fold(windows, parsed, set(), self.interval_s, "metrics")
        if folded.rejected:
            raise ValueError(f"report refused: {folded.rejected[0].reason}: {folded.rejected[0].detail}")
        self.open = folded.changed.get(self.job_id, self.open)
        return folded.closed

    def close(self, closed_at: float | None = None) -> MetricWindow | None:
        """Close the open window (None when no report came in it), stamped `closed_at`."""
        if self.open is None:
            return None
        window = monitor_kernel.close(self.open, self.job_id, self.interval_s)
        self.open = None
        return window if closed_at is None else window.model_copy(update={"closed_at": closed_at})

    # ------------------------------------------------------------------ analyze

    def analyze(self, window: MetricWindow) -> Analysis:
        """The window's analysis, as analyze publishes it."""
        settings = analyze_kernel.forecast_settings(window, self.config, self.state.needs_forecast)
        forecast = self.forecaster(window, settings) if settings is not None and self.forecaster else None
        fallback = None
        if analyze_kernel.needs_fallback(window):
            fallback = next((a.model_dump(mode="json") for a in reversed(self.recent) if a.valid), None)
        analyzed = analyze_kernel.analyze(window, self.config, self.learned, fallback, forecast)
        self.learned = analyzed.learned
        self.recent.append(analyzed.analysis)
        return analyzed.analysis

    # ------------------------------------------------------------------ plan

    @property
    def state(self) -> PlanState:
        return run_now(self.knowledge.plan_state(self.job_id))

    def decide(self, analysis: Analysis, *, rescaling: bool | None = None) -> plan_kernel.Decided:
        """The decision for the window (committed with its plan-state changes, as plan commits it);
        `rescaling` defaults to whether execute holds the job's lock, as plan reads it."""
        rescaling = self.rescaling if rescaling is None else rescaling
        planned = plan_kernel.plan(self.state, analysis, self.config, rescaling=rescaling, quota=self.quota,
                                   policy=self.policy)
        granted = given = None
        if planned.reserve is not None:
            r = planned.reserve
            granted = run_now(self.knowledge.reserve_slots(self.job_id, r.current, r.wanted, r.quota, r.commit))
        if planned.bid is not None:
            step = plan_kernel.fleet_step(planned, self.config)
            given = run_now(self.knowledge.update_fleet(self.config.cluster, step))
        decided = plan_kernel.finish(planned, analysis, self.config, granted, given)
        run_now(self.knowledge.commit_window(self.job_id, plan_kernel.STAGE, analysis.window_end, decided.message(),
                                             state_fields=decided.state_fields))
        return decided

    # ------------------------------------------------------------------ execute

    @property
    def rescaling(self) -> bool:
        """Whether a rescale of the job is in flight (execute holds its lock)."""
        return run_now(self.knowledge.lock_holder(self.job_id)) is not None

    def execute(self, decision: ScalingDecision) -> RescaleCommand | None:
        """Execute's steps for the decision (`execute.kernel`, performed by execute's own shell on the
        in-memory knowledge); the command sent to the job's runner, if one was."""
        self.sent.clear()
        run_now(self.executor.execute(decision))
        commands = [RescaleCommand.model_validate_json(value) for topic, _, value in self.sent if topic == COMMANDS]
        self.commands += commands
        self.events += [ScalingEvent.model_validate_json(value) for topic, _, value in self.sent
                        if topic == "scaling_events"]
        return commands[-1] if commands else None

    def runner_report(self, report: RunnerReport) -> None:
        """The job runner's answer to a command: execute ends the rescale (`execute.kernel.on_report`)."""
        self.sent.clear()
        run_now(self.executor.on_report(report.to_bytes()))
        self.events += [ScalingEvent.model_validate_json(value) for topic, _, value in self.sent
                        if topic == "scaling_events"]

    def rescale_completed(self, running: int, completed_at: float, downtime_s: float | None,
                          backend: BackendKind | None = None) -> None:
        """The runner's `completed` report for the rescale in flight."""
        tracked = run_now(self.knowledge.inflight(self.job_id))
        if tracked is None:
            raise RuntimeError(f"no rescale of {self.job_id} is in flight")
        self.runner_report(RunnerReport(
            decision_id=tracked.decision_id, job_id=self.job_id, status=RunnerStatus.COMPLETED,
            from_parallelism=tracked.from_parallelism, to_parallelism=tracked.to_parallelism,
            running_parallelism=running, fencing_token=tracked.token, downtime_s=downtime_s,
            timestamp=completed_at, backend=backend,
        ))

    async def _publish(self, topic: str, key: str, value: bytes) -> None:
        self.sent.append((topic, key, value))


class Loops:
    """Many jobs' loops in one process over one in-memory knowledge base, fed the records the agents
    read: the metric topic's records (`records`) and the job runners' reports (`runner_report`).

    As the agents run them: a batch of records is parsed and folded by monitor's kernel (bad records
    become dead letters, windows close on a later window's report), each closed window is analyzed,
    planned and executed in its job's loop. The jobs share the knowledge base, so a slot quota binds
    across them as it does live."""

    def __init__(self, configs: dict[str, JobConfig], settings: Settings,
                 forecasters: dict[str, Forecaster] | None = None) -> None:
        self.settings = settings
        self.knowledge = MemoryKnowledge(settings)
        self.jobs = {job: JobLoop(job, config, forecaster=(forecasters or {}).get(job),
                                  interval_s=settings.loop_interval_s, quota=settings.slot_quota,
                                  knowledge=self.knowledge)
                     for job, config in configs.items()}
        self.dead_letters: list[DeadLetter] = []
        self.decisions: list[ScalingDecision] = []

    def records(self, records: list[Incoming], now: float) -> list[ScalingDecision]:
        """One batch of the metric topic's records; the decisions of the windows it closed, in order."""
        topic, settings = self.settings.topics.metrics, self.settings
        parsed = monitor_kernel.parse(records, topic, settings.max_message_bytes, now, settings.max_clock_skew_s)
        unknown = parsed.job_ids() - set(self.jobs)
        windows = {job: loop.open for job, loop in self.jobs.items() if loop.open is not None}
        orphaned = run_now(self.knowledge.orphaned_jobs())
        folded = monitor_kernel.fold(windows, parsed, unknown, settings.loop_interval_s, topic, orphaned,
                                     spread=settings.window_spread)
        for job, state in folded.changed.items():
            self.jobs[job].open = state
        self.dead_letters += folded.rejected
        made = []
        for window in folded.closed:
            loop = self.jobs[window.job_id]
            decided = loop.decide(loop.analyze(window))
            loop.execute(decided.decision)
            made.append(decided.decision)
        self.decisions += made
        return made

    def runner_report(self, report: RunnerReport) -> None:
        self.jobs[report.job_id].runner_report(report)

    def commands(self, job_id: str) -> list[RescaleCommand]:
        """The commands execute sent for the job, in order."""
        return self.jobs[job_id].commands

"""One job's MAPE-K loop in one process: the stages' kernels, as the agents run them, without the topics.

The agents are shells around pure kernels (`monitor.kernel`, `analyze.kernel`, `plan.kernel`,
`execute.kernel`); this is the simulator's shell around the same kernels, for one job:

- monitor: `fold` takes the job's metric reports into its open window; `close` closes it at the
  window's end (a live monitor closes it on the next window's first report: the same window, later);
- analyze: `analyze` runs the kernel on the closed window with the learned state kept here and the
  forecast `forecaster` makes (None: no forecast), for a job whose policy plans with one;
- plan: `decide` runs the planner step and the decision on the plan state, which lives in an
  in-memory knowledge base (`knowledge.MemoryKnowledge`, the same behaviour as Redis), with the slot
  quota reserved there when one is set; decisions are committed there as plan commits them;
- execute: `rescale_ended` records the end of a rescale in the plan state as execute does.

Kept here rather than in knowledge, for speed, with the same meaning: the open window, the learned
state and the last 60 analyses (the fallback of an idle window, `last_valid_analysis`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from analyze import kernel as analyze_kernel
from analyze.arima import ForecastConfig
from contracts.analyses import Analysis, ForecastView
from contracts.jobs import JobConfig
from contracts.messages import MetricReport, MetricWindow
from contracts.plan_state import PlanState
from contracts.settings import Settings
from contracts.stage import Incoming
from knowledge.memory import MemoryKnowledge, run_now
from monitor import kernel as monitor_kernel
from monitor.windows import WindowState
from plan import kernel as plan_kernel
from plan.policy import ScalingPolicy

Forecaster = Callable[[MetricWindow, ForecastConfig], ForecastView | None]
"""The forecast analyze would publish for a window, given the forecaster's settings."""

FALLBACK_SCAN = 60  # as `knowledge.last_valid_analysis` scans


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

    def decide(self, analysis: Analysis, *, rescaling: bool) -> plan_kernel.Decided:
        """The decision for the window (committed with its plan-state changes, as plan commits it)."""
        planned = plan_kernel.plan(self.state, analysis, self.config, rescaling=rescaling, quota=self.quota,
                                   policy=self.policy)
        granted = None
        if planned.reserve is not None:
            r = planned.reserve
            granted = run_now(self.knowledge.reserve_slots(self.job_id, r.current, r.wanted, r.quota, r.commit))
        decided = plan_kernel.finish(planned, analysis, self.config, granted)
        run_now(self.knowledge.commit_window(self.job_id, plan_kernel.STAGE, analysis.window_end, decided.message(),
                                             state_fields=decided.state_fields))
        return decided

    # ------------------------------------------------------------------ execute

    def rescale_ended(self, from_parallelism: int, to_parallelism: int, running: int, completed_at: float,
                      downtime_s: float | None, backend: str | None = None) -> None:
        """Execute's record of a rescale's end in the plan state."""
        direction = "up" if to_parallelism > from_parallelism else "down"
        run_now(self.knowledge.record_rescale_end(self.job_id, running, completed_at, downtime_s, direction, backend))

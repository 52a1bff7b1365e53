"""The shell around `analyze.forecast`: state and model in knowledge, work off the event loop.

A `step` (filter and forecast, milliseconds) runs in a thread; a refit (seconds) runs in a
process pool at a lower CPU priority, at most one per job, and is swapped in when done. Nothing is
kept in process memory between windows except the refits under way, so another worker continues
a job from knowledge; a refit lost with a dead worker is requested again.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

from threadpoolctl import threadpool_limits

from analyze.arima import ForecastConfig, fit_model
from analyze.forecast import ForecastDecision, ForecastState, RetrainRequest, abandon_retrain, install_model, step
from knowledge.protocols import AnalyzeKnowledge, StoredForecast

log = logging.getLogger("autoscaler.analyze")

REFIT_NICENESS = 10


def _lower_priority() -> None:
    # Refits yield the CPU to decisions: a refit may wait, a decision should not. One BLAS thread:
    # a refit is one job's work, and more threads would compete with the agent's core.
    os.nice(REFIT_NICENESS)
    import pmdarima  # noqa: F401 - loads scipy's BLAS and sklearn's OpenMP first: the limit covers loaded libraries only

    threadpool_limits(limits=1)


class Forecasting:
    def __init__(self, knowledge: AnalyzeKnowledge, refit_workers: int = 1) -> None:
        # A step's linear algebra is small: BLAS threads would only contend with the refits. scipy's
        # OpenBLAS (statsmodels' filter) is loaded first: the limit covers loaded libraries only.
        import scipy.linalg  # noqa: F401

        threadpool_limits(limits=1)
        self.knowledge = knowledge
        self.refit_workers = refit_workers
        self._pool: ProcessPoolExecutor | None = None
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.refits: dict[str, asyncio.Task[None]] = {}

    @property
    def pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: forking a process that runs an event loop and threads is unsafe.
            self._pool = ProcessPoolExecutor(self.refit_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_lower_priority)
        return self._pool

    def lock(self, job_id: str) -> asyncio.Lock:
        """Held from a window's reads to its commit, and by a refit's install: one job's forecast is
        changed by one of them at a time in this worker."""
        return self._locks[job_id]

    def _state(self, job_id: str, state_json: str | None) -> ForecastState:
        state = ForecastState.model_validate_json(state_json) if state_json else ForecastState()
        if state.retrain_outstanding and job_id not in self.refits:
            state = abandon_retrain(state)  # requested by a worker that is gone: ask again
        return state

    async def advance(self, job_id: str, stored: StoredForecast, arrival_rate: float, now: float,
                      config: ForecastConfig) -> tuple[ForecastDecision, StoredForecast]:
        """The forecast step on the stored forecast, and what to store with the window's commit; the caller
        holds `lock(job_id)` from its read to that commit, then calls `started`. A step that updates a model
        runs in a thread; without one it is a few array operations, cheaper than the thread's hop."""
        state = self._state(job_id, stored.state_json)
        if stored.model is None:
            state, decision = step(state, [arrival_rate], now, config, None)
        else:
            state, decision = await asyncio.to_thread(step, state, [arrival_rate], now, config, stored.model)
        return decision, StoredForecast(state.model_dump_json(), decision.model)

    def started(self, job_id: str, decision: ForecastDecision, config: ForecastConfig) -> None:
        """Start the refit a committed step asked for, in the process pool."""
        if decision.retrain is not None:
            self.refits[job_id] = asyncio.create_task(self._refit(job_id, decision.retrain, config))

    async def _refit(self, job_id: str, request: RetrainRequest, config: ForecastConfig) -> None:
        loop = asyncio.get_running_loop()
        try:
            model: bytes | None = await loop.run_in_executor(self.pool, fit_model, request.history, config)
        except Exception as exc:  # a failed fit is retried later; the agent goes on
            log.warning("%s: forecast refit %d failed: %s", job_id, request.request_id, exc)
            model = None
        try:
            async with self._locks[job_id]:
                state_json, current = await self.knowledge.forecast(job_id)
                state = self._state(job_id, state_json)
                state, installed = await asyncio.to_thread(install_model, state, model, request.request_id, config,
                                                           current)
                await self.knowledge.save_forecast(job_id, state.model_dump_json(), installed)
            if model is not None:
                log.info("%s: forecast model %d installed (%s)", job_id, request.request_id, request.reason)
        finally:
            self.refits.pop(job_id, None)

    async def drain(self) -> None:
        """Wait for the refits under way (tests and benchmarks)."""
        while self.refits:
            await asyncio.gather(*list(self.refits.values()), return_exceptions=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

"""`autoscaler job run`: run a Spark streaming job under the autoscaler's control."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from contracts.settings import get_settings

if TYPE_CHECKING:
    from execute.backend import ScalingBackend
    from pipeline.restart import SparkJobConfig

job_app = typer.Typer(help="Run Spark streaming jobs that the autoscaler rescales.", no_args_is_help=True)


@job_app.callback()
def _job() -> None:
    """Run Spark streaming jobs that the autoscaler rescales."""


def parse_pairs(pairs: list[str] | None, what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must be key=value, not {pair!r}")
        result[key.strip()] = value
    return result


@job_app.command("run")
def run(
    job_id: Annotated[str, typer.Option("--job-id", help="The job's id in every topic.")],
    checkpoint_dir: Annotated[
        Path, typer.Option("--checkpoint-dir", help="The job's directory: checkpoint, runner state, pause file.")
    ],
    entry: Annotated[
        str,
        typer.Option(
            "--entry", help="module:function building the query (see pipeline.job); must be listed in "
            "AUTOSCALER_JOB_ENTRY_POINTS.",
        ),
    ] = "pipeline.demo:build",
    parallelism: Annotated[
        int,
        typer.Option(
            "--parallelism", "-p", min=1,
            help="Initial task slots; a restarted runner resumes at the last parallelism it applied.",
        ),
    ] = 1,
    master: Annotated[
        str | None, typer.Option("--master", help="spark://host:port for a standalone cluster; default local[N].")
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="How a rescale is done: inplace (change a running application's "
                          "executors; a standalone cluster only), restart (from the checkpoint), or auto "
                          "(inplace on a cluster, restart otherwise).")
    ] = "auto",
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Job option key=value (repeatable), e.g. cost_ms=4.")
    ] = None,
    conf: Annotated[list[str] | None, typer.Option("--conf", help="Extra Spark conf key=value (repeatable).")] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", help="Kafka bootstrap; default AUTOSCALER_KAFKA_BOOTSTRAP.")
    ] = None,
    metrics_topic: Annotated[str | None, typer.Option("--metrics-topic")] = None,
    commands_topic: Annotated[str | None, typer.Option("--commands-topic")] = None,
    reports_topic: Annotated[str | None, typer.Option("--reports-topic")] = None,
    trigger_interval: Annotated[
        float, typer.Option("--trigger-interval", help="Seconds between micro-batch starts; 0: back to back.")
    ] = 1.0,
    report_interval: Annotated[float, typer.Option("--report-interval", help="Seconds per MetricReport.")] = 5.0,
    max_records_per_trigger: Annotated[int | None, typer.Option("--max-records-per-trigger", min=1)] = None,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Start attempts beyond the first.")] = 2,
    max_parallelism: Annotated[
        int | None, typer.Option("--max-parallelism", min=1, help="Refuse commands above this.")
    ] = None,
    start_timeout: Annotated[float, typer.Option("--start-timeout")] = 120.0,
    stop_timeout: Annotated[float, typer.Option("--stop-timeout")] = 60.0,
    listen: Annotated[bool, typer.Option("--listen/--no-listen", help="Consume RescaleCommands.")] = True,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Start the job and apply the RescaleCommands addressed to it until stopped (SIGTERM/Ctrl-C)."""
    from infra.security import EntryPointNotAllowed, check_entry_point

    settings = get_settings()
    try:
        # Before any import of job code (and before Spark): only configured entry points run.
        check_entry_point(entry, settings)
    except EntryPointNotAllowed as exc:
        raise typer.BadParameter(str(exc), param_hint="--entry") from None

    from execute.backend import RunnerFatal, StartError
    from execute.runner import RunnerConfig, run_job
    from pipeline.restart import SparkJobConfig

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    overrides = {
        name: value
        for name, value in (
            ("metrics", metrics_topic),
            ("commands", commands_topic),
            ("runner_reports", reports_topic),
        )
        if value
    }
    if overrides:
        settings = settings.model_copy(update={"topics": settings.topics.model_copy(update=overrides)})
    options = parse_pairs(option, "--option")
    if max_records_per_trigger:
        options["maxRecordsPerTrigger"] = str(max_records_per_trigger)
    job = SparkJobConfig(
        job_id=job_id,
        entry_point=entry,
        checkpoint_dir=checkpoint_dir,
        master=master,
        bootstrap=bootstrap,
        options=options,
        spark_conf=parse_pairs(conf, "--conf"),
        trigger_interval_s=trigger_interval or None,
        report_interval_s=report_interval,
        stop_timeout_s=stop_timeout,
        start_timeout_s=start_timeout,
        retries=retries,
        settings=settings,
    )
    runner = RunnerConfig(
        job_id=job_id,
        parallelism=parallelism,
        state_dir=checkpoint_dir,
        bootstrap=bootstrap,
        retries=retries,
        max_parallelism=max_parallelism,
        listen=listen,
        settings=settings,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %d: stopping the job between micro-batches", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        run_job(runner, choose_backend(backend, job, max_parallelism), stop)
    except (StartError, RunnerFatal) as exc:
        logging.getLogger(__name__).error("the job is not running: %s", exc)
        raise typer.Exit(1) from exc


def choose_backend(name: str, job: SparkJobConfig, max_parallelism: int | None) -> ScalingBackend:
    """The scaling backend `name` asks for; in place falls back to restarting, saying why, where the
    cluster manager cannot change executors."""
    from pipeline.inplace import InPlaceExecutors, can_change_in_place
    from pipeline.restart import RestartFromCheckpoint

    if name not in ("auto", "inplace", "restart"):
        raise typer.BadParameter(f"unknown backend {name!r}: inplace, restart or auto", param_hint="--backend")
    reason = can_change_in_place(job.master)
    if name == "restart" or (name == "auto" and reason is not None):
        return RestartFromCheckpoint(job)
    if reason is not None:
        logging.getLogger(__name__).warning("--backend inplace: %s", reason)
        return RestartFromCheckpoint(job)
    if max_parallelism is None and name == "auto":
        logging.getLogger(__name__).warning("no --max-parallelism: rescaling restarts the query from its checkpoint")
        return RestartFromCheckpoint(job)
    if max_parallelism is None:
        raise typer.BadParameter("in place needs --max-parallelism: the query's task count is fixed at it",
                                 param_hint="--max-parallelism")
    return InPlaceExecutors(job, max_parallelism)


if __name__ == "__main__":
    job_app()

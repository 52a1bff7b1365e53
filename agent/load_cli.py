"""`autoscaler load run`: produce demo records into a topic at a rate that follows a shape or a trace."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated

import typer

from evaluation.traces import read_rates, scale_rates
from pipeline.loadgen import LINGER_MS, Replay, Shape, expected_total, generate_load, parse_shape, record_maker


def replay_file(
    path: str | Path,
    *,
    seconds_per_row: float = 1.0,
    start_row: int = 0,
    rows: int | None = None,
    peak: float | None = None,
    mean: float | None = None,
    low: float | None = None,
    high: float | None = None,
    interpolate: bool = True,
) -> Replay:
    """The rows `start_row` .. of a trace file, scaled (keeping the shape), as a replay."""
    values = read_rates(path)[start_row : None if rows is None else start_row + rows]
    if not values:
        raise ValueError(f"no rows in {path} from row {start_row}")
    return Replay(tuple(scale_rates(values, peak=peak, mean=mean, low=low, high=high)), seconds_per_row, interpolate)


loadgen_app = typer.Typer(help="Produce demo records at a rate that follows a shape or a trace.", no_args_is_help=True)


@loadgen_app.callback()
def _load() -> None:
    """Produce demo records at a rate that follows a shape or a trace."""


@loadgen_app.command("run")
def run(
    shape: Annotated[
        str | None,
        typer.Option("--shape", help="constant:RATE | steps:R1:S1,R2:S2,... | sine:MEAN:AMPLITUDE:PERIOD | "
                     "cosine:MEAN:AMPLITUDE:PERIOD (from the trough)"),
    ] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="A `second|count` or `date,messages` CSV.")] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Seconds; default the shape's end.")] = None,
    seconds_per_row: Annotated[float, typer.Option("--seconds-per-row", help="Replay time of one trace row.")] = 1.0,
    start_row: Annotated[int, typer.Option("--start-row")] = 0,
    rows: Annotated[int | None, typer.Option("--rows")] = None,
    peak: Annotated[float | None, typer.Option("--peak", help="Rescale the trace to this peak rate.")] = None,
    mean: Annotated[float | None, typer.Option("--mean", help="Rescale the trace to this mean rate.")] = None,
    low: Annotated[float | None, typer.Option("--low", help="Map the trace's minimum to this rate.")] = None,
    high: Annotated[float | None, typer.Option("--high", help="Map the trace's maximum to this rate.")] = None,
    topic: Annotated[str, typer.Option("--topic")] = "demo.input",
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", help="Default AUTOSCALER_KAFKA_BOOTSTRAP.")
    ] = None,
    keys: Annotated[int, typer.Option("--keys", min=1)] = 16,
    start_id: Annotated[int, typer.Option("--start-id", min=0)] = 0,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="For a topic created here.")] = 4,
    quiet: Annotated[bool, typer.Option("--quiet")] = False,
    linger_ms: Annotated[
        float, typer.Option("--linger-ms", min=0, help="The producer's batching delay per partition.")
    ] = LINGER_MS,
    records: Annotated[
        str, typer.Option("--records", help="demo | dedup[:FRACTION] | join | nexmark[:SEED] (pipeline.loadgen).")
    ] = "demo",
) -> None:
    """Produce the load; print a JSON summary with the number of records produced."""
    from contracts.settings import get_settings
    from infra.security import kafka_security_config

    if (shape is None) == (trace is None):
        raise typer.BadParameter("give one of --shape or --trace")
    try:
        chosen: Shape = (
            parse_shape(shape, duration)
            if shape is not None
            else replay_file(
                trace,  # type: ignore[arg-type]
                seconds_per_row=seconds_per_row,
                start_row=start_row,
                rows=rows,
                peak=peak,
                mean=mean,
                low=low,
                high=high,
            )
        )
        maker = record_maker(records)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    stop = threading.Event()

    def progress(t: float, produced: int) -> None:
        if not quiet:
            typer.echo(f"{t:7.1f} s  {produced} records  rate now {chosen.rate(t):.0f}/s", err=True)

    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    result = generate_load(
        bootstrap or get_settings().kafka_bootstrap,
        topic,
        chosen,
        duration_s=duration,
        keys=keys,
        start_id=start_id,
        partitions=partitions,
        stop_event=stop,
        on_progress=progress,
        security=kafka_security_config(get_settings()),
        linger_ms=linger_ms,
        record=maker,
    )
    expected = expected_total(chosen, min(result.seconds, duration or chosen.duration_s or result.seconds))
    typer.echo(json.dumps({
        "produced": result.produced,
        "seconds": round(result.seconds, 3),
        "rate": round(result.rate, 1),
        "expected": round(expected),
        "start_id": result.start_id,
        "next_id": result.next_id,
        "topic": topic,
        "began_at": round(result.began_at, 3),
    }))

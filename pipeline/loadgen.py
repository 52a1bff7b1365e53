"""Load generator: demo records to a Kafka topic at a rate that follows a shape.

Records are JSON {"id": <int>, "key": <str>, "ts": <float>} with sequential ids from `start_id`,
key k<id mod keys> (also the Kafka key) and ts the send time (epoch s).

Shapes (`--shape`):
  constant:RATE                       RATE records/s
  steps:RATE1:SECS1,RATE2:SECS2,...   each rate for its seconds, in turn
  sine:MEAN:AMPLITUDE:PERIOD          MEAN + AMPLITUDE * sin(2 pi t / PERIOD)
or a trace (`--trace FILE`): a Daedalus `second|count` or a load-prediction `date,messages` CSV, one
rate per row, rescaled to a chosen peak, mean or min..max range and replayed at `seconds_per_row`
seconds per row (time-compressed when that is shorter than the trace's own resolution).

Pacing follows the integral of the rate, so the count over any stretch longer than a tick is
within one record of the shape's; the sender catches up after a stall instead of losing records.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Protocol

import typer

log = logging.getLogger(__name__)


class Shape(Protocol):
    @property
    def duration_s(self) -> float | None: ...

    def rate(self, t: float) -> float: ...


@dataclass(frozen=True)
class Constant:
    rate_per_s: float
    duration_s: float | None = None

    def rate(self, t: float) -> float:
        return self.rate_per_s


@dataclass(frozen=True)
class Steps:
    steps: tuple[tuple[float, float], ...]  # (rate, seconds)

    @property
    def duration_s(self) -> float:
        return sum(secs for _, secs in self.steps)

    def rate(self, t: float) -> float:
        elapsed = 0.0
        for rate, secs in self.steps:
            elapsed += secs
            if t < elapsed:
                return rate
        return 0.0


@dataclass(frozen=True)
class Sine:
    mean: float
    amplitude: float
    period_s: float
    duration_s: float | None = None

    def rate(self, t: float) -> float:
        return max(0.0, self.mean + self.amplitude * math.sin(2 * math.pi * t / self.period_s))


@dataclass(frozen=True)
class Trace:
    """Row i's rate holds at t = i * seconds_per_row; between rows the rate is interpolated."""

    rates: tuple[float, ...]
    seconds_per_row: float = 1.0
    interpolate: bool = True

    @property
    def duration_s(self) -> float:
        return len(self.rates) * self.seconds_per_row

    def rate(self, t: float) -> float:
        if not self.rates or t < 0 or t >= self.duration_s:
            return 0.0
        position = t / self.seconds_per_row
        row = int(position)
        if not self.interpolate or row + 1 >= len(self.rates):
            return self.rates[row]
        frac = position - row
        return self.rates[row] * (1 - frac) + self.rates[row + 1] * frac


def parse_shape(spec: str, duration_s: float | None = None) -> Shape:
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    try:
        if kind == "constant":
            return Constant(float(rest), duration_s)
        if kind == "steps":
            steps = []
            for part in rest.split(","):
                rate, _, secs = part.partition(":")
                steps.append((float(rate), float(secs)))
            if not steps or any(r < 0 or s <= 0 for r, s in steps):
                raise ValueError("rates must be >= 0 and seconds > 0")
            return Steps(tuple(steps))
        if kind == "sine":
            mean, amplitude, period = (float(x) for x in rest.split(":"))
            if period <= 0:
                raise ValueError("the period must be > 0")
            return Sine(mean, amplitude, period, duration_s)
    except ValueError as exc:
        raise ValueError(f"bad shape {spec!r}: {exc}") from None
    raise ValueError(f"unknown shape {spec!r}: constant:RATE, steps:R1:S1,R2:S2,... or sine:MEAN:AMP:PERIOD")


# ---------------------------------------------------------------- traces


def read_trace(path: str | Path) -> list[float]:
    """The value column (the last one) of a `second|count` or `date,messages` trace."""
    text = Path(path).read_text().splitlines()
    if not text:
        return []
    delimiter = "|" if "|" in text[0] else ","
    values = []
    for row in csv.reader(text, delimiter=delimiter):
        if not row:
            continue
        try:
            values.append(float(row[-1]))
        except ValueError:
            continue  # the header
    return values


def rescale(
    values: Sequence[float],
    *,
    peak: float | None = None,
    mean: float | None = None,
    low: float | None = None,
    high: float | None = None,
) -> list[float]:
    """Scale a trace, keeping its shape: to a peak, to a mean, or linearly onto low..high."""
    if not values:
        return []
    chosen = sum(x is not None for x in (peak, mean)) + (1 if low is not None or high is not None else 0)
    if chosen > 1:
        raise ValueError("choose one of peak, mean, or low..high")
    if low is not None or high is not None:
        if low is None or high is None or high < low:
            raise ValueError("low..high needs both ends, low <= high")
        lo, hi = min(values), max(values)
        if hi == lo:
            return [(low + high) / 2] * len(values)
        return [low + (v - lo) * (high - low) / (hi - lo) for v in values]
    if peak is not None:
        top = max(values)
        return [v * peak / top if top > 0 else 0.0 for v in values]
    if mean is not None:
        avg = sum(values) / len(values)
        return [v * mean / avg if avg > 0 else 0.0 for v in values]
    return list(values)


def load_trace(
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
) -> Trace:
    values = read_trace(path)[start_row : None if rows is None else start_row + rows]
    if not values:
        raise ValueError(f"no rows in {path} from row {start_row}")
    return Trace(tuple(rescale(values, peak=peak, mean=mean, low=low, high=high)), seconds_per_row, interpolate)


# ---------------------------------------------------------------- pacing (pure)


def records_between(shape: Shape, t0: float, t1: float, steps: int = 4) -> float:
    """The integral of the rate over [t0, t1] (midpoint rule)."""
    if t1 <= t0:
        return 0.0
    width = (t1 - t0) / steps
    return sum(shape.rate(t0 + (i + 0.5) * width) for i in range(steps)) * width


def expected_total(shape: Shape, duration_s: float, step_s: float = 0.01) -> float:
    """Records the shape asks for over `duration_s`."""
    edges = [i * step_s for i in range(int(duration_s / step_s) + 1)]
    if edges[-1] < duration_s:
        edges.append(duration_s)
    return sum(records_between(shape, a, b, 1) for a, b in itertools.pairwise(edges))


def demo_record(record_id: int, keys: int, now: float) -> tuple[bytes, bytes]:
    key = f"k{record_id % keys}"
    return key.encode(), json.dumps({"id": record_id, "key": key, "ts": now}, separators=(",", ":")).encode()


# ---------------------------------------------------------------- the sender


@dataclass
class LoadResult:
    produced: int
    seconds: float
    start_id: int
    next_id: int

    @property
    def rate(self) -> float:
        return self.produced / self.seconds if self.seconds > 0 else 0.0


def generate_load(
    bootstrap: str,
    topic: str,
    shape: Shape,
    *,
    duration_s: float | None = None,
    keys: int = 16,
    start_id: int = 0,
    partitions: int = 4,
    tick_s: float = 0.01,
    stop_event: threading.Event | None = None,
    on_progress: Callable[[float, int], None] | None = None,
    security: Mapping[str, str] | None = None,
) -> LoadResult:
    """Produce demo records following `shape` until its end, `duration_s`, or `stop_event`.

    `security`: SASL/SSL client properties (infra.security.kafka_security_config)."""
    from confluent_kafka import Producer

    from infra.kafka import ensure_topic

    duration = duration_s if duration_s is not None else shape.duration_s
    if duration is None:
        raise ValueError("this shape has no end: give a duration")
    if keys < 1:
        raise ValueError("keys must be at least 1")
    ensure_topic(bootstrap, topic, partitions, security=security)
    producer = Producer(
        {"bootstrap.servers": bootstrap, **(security or {}), "linger.ms": 5, "enable.idempotence": True}
    )
    stop_event = stop_event or threading.Event()
    next_id = start_id
    budget = 0.0
    began = time.monotonic()
    last = 0.0
    last_report = 0.0
    while not stop_event.is_set():
        now = min(time.monotonic() - began, duration)
        budget += records_between(shape, last, now)
        last = now
        due = int(budget)
        budget -= due
        wall = time.time()
        for _ in range(due):
            key, value = demo_record(next_id, keys, wall)
            while True:
                try:
                    producer.produce(topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)  # the local queue is full: let deliveries drain
            next_id += 1
        producer.poll(0)
        if on_progress is not None and now - last_report >= 1.0:
            on_progress(now, next_id - start_id)
            last_report = now
        if now >= duration:
            break
        stop_event.wait(max(0.0, tick_s - (time.monotonic() - began - now)))
    remaining = producer.flush(30)
    if remaining:
        log.error("%d records were not delivered", remaining)
    return LoadResult(next_id - start_id - remaining, time.monotonic() - began, start_id, next_id)


# ---------------------------------------------------------------- command line

loadgen_app = typer.Typer(help="Produce demo records at a rate that follows a shape or a trace.", no_args_is_help=True)


@loadgen_app.callback()
def _load() -> None:
    """Produce demo records at a rate that follows a shape or a trace."""


@loadgen_app.command("run")
def run(
    shape: Annotated[
        str | None,
        typer.Option("--shape", help="constant:RATE | steps:R1:S1,R2:S2,... | sine:MEAN:AMPLITUDE:PERIOD"),
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
            else load_trace(
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
    }))


if __name__ == "__main__":
    loadgen_app()


"""Load generator: records to a Kafka topic at a rate that follows a shape.

By default records are demo records, JSON {"id": <int>, "key": <str>, "ts": <float>} with sequential
ids from `start_id`, key k<id mod keys> (also the Kafka key) and ts the send time (epoch s). Other
record makers (`record_maker`, `--records` of `autoscaler load run`):
  demo               the demo records above;
  dedup[:FRACTION]   demo records of which FRACTION (default 0.1) resend an id sent shortly before
                     (`dedup_source_id` says which), for deduplicating jobs;
  join               orders and payments for a stream-stream join: record n is order n // 2's order
                     (n even) or its payment (n odd), {"id", "key", "ts", "side", "order"};
  nexmark[:SEED]     Nexmark Person, Auction and Bid events, event id = record id (pipeline.nexmark).
Every record's ts is its send time, its event time.

Shapes (`--shape`):
  constant:RATE                       RATE records/s
  steps:RATE1:SECS1,RATE2:SECS2,...   each rate for its seconds, in turn
  sine:MEAN:AMPLITUDE:PERIOD          MEAN + AMPLITUDE * sin(2 pi t / PERIOD)
  cosine:MEAN:AMPLITUDE:PERIOD        MEAN - AMPLITUDE * cos(2 pi t / PERIOD): from the trough, the
                                      usual load pattern of stream autoscaler evaluations
or a `Replay` of recorded rates (`autoscaler load run --trace FILE` reads a trace file with the
evaluation's trace loader, scaled to a chosen peak, mean or min..max range, and replays it at
`seconds_per_row` seconds per row: time-compressed when that is shorter than the trace's own resolution).

Pacing follows the integral of the rate, so the count over any stretch longer than a tick is
within one record of the shape's; the sender catches up after a stall instead of losing records.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from pipeline.nexmark import NexmarkConfig, nexmark_record

log = logging.getLogger(__name__)


class Shape(Protocol):
    @property
    def duration_s(self) -> float | None: ...

    def rate(self, t: float) -> float: ...


def _number(value: float) -> str:
    """The shortest text that reads back as `value` exactly (no trailing ".0")."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Constant:
    rate_per_s: float
    duration_s: float | None = None

    def rate(self, t: float) -> float:
        return self.rate_per_s

    def spec(self) -> str:
        """The `--shape` text `parse_shape` reads back as this shape (its duration apart)."""
        return f"constant:{_number(self.rate_per_s)}"

    def scaled(self, factor: float) -> Constant:
        return Constant(self.rate_per_s * factor, self.duration_s)


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

    def spec(self) -> str:
        return "steps:" + ",".join(f"{_number(rate)}:{_number(secs)}" for rate, secs in self.steps)

    def scaled(self, factor: float) -> Steps:
        return Steps(tuple((rate * factor, secs) for rate, secs in self.steps))


@dataclass(frozen=True)
class Sine:
    mean: float
    amplitude: float
    period_s: float
    duration_s: float | None = None
    from_trough: bool = False  # MEAN - AMPLITUDE * cos(...): a period from its trough (`cosine:`)

    def rate(self, t: float) -> float:
        angle = 2 * math.pi * t / self.period_s
        wave = -math.cos(angle) if self.from_trough else math.sin(angle)
        return max(0.0, self.mean + self.amplitude * wave)

    def spec(self) -> str:
        kind = "cosine" if self.from_trough else "sine"
        return f"{kind}:{_number(self.mean)}:{_number(self.amplitude)}:{_number(self.period_s)}"

    def scaled(self, factor: float) -> Sine:
        return Sine(self.mean * factor, self.amplitude * factor, self.period_s, self.duration_s, self.from_trough)


@dataclass(frozen=True)
class Replay:
    """A recorded series of rates: row i's rate holds at t = i * seconds_per_row, interpolated between rows."""

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


def parse_shape(spec: str, duration_s: float | None = None) -> Constant | Steps | Sine:
    """The shape a `--shape` spec names (the grammar in the module doc); its `spec()` renders it back."""
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
        if kind in ("sine", "cosine"):
            mean, amplitude, period = (float(x) for x in rest.split(":"))
            if period <= 0:
                raise ValueError("the period must be > 0")
            return Sine(mean, amplitude, period, duration_s, from_trough=kind == "cosine")
    except ValueError as exc:
        raise ValueError(f"bad shape {spec!r}: {exc}") from None
    raise ValueError(f"unknown shape {spec!r}: constant:RATE, steps:R1:S1,R2:S2,..., sine:MEAN:AMP:PERIOD or "
                     "cosine:MEAN:AMP:PERIOD")


def scaled_shape(spec: str, factor: float) -> str:
    """The shape spec with every rate times `factor` (a sine's or cosine's mean and amplitude), its times
    unchanged; pure. A benchmark sizes one pattern to workloads whose records cost differently with it."""
    if factor <= 0:
        raise ValueError(f"the factor must be > 0, not {factor}")
    return parse_shape(spec).scaled(factor).spec()


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


# (record id, keys, send time) -> (Kafka key, value): one record per id the sender counts.
RecordMaker = Callable[[int, int, float], tuple[bytes, bytes]]
DEFAULT_DUPLICATES = 0.1
# A resent id is one of the RESEND_WINDOW ids sent just before it.
RESEND_WINDOW = 8


def demo_record(record_id: int, keys: int, now: float) -> tuple[bytes, bytes]:
    key = f"k{record_id % keys}"
    return key.encode(), json.dumps({"id": record_id, "key": key, "ts": now}, separators=(",", ":")).encode()


def dedup_source_id(record_id: int, fraction: float, seed: int = 0) -> int:
    """The id record `record_id` carries in a deduplication load: its own, or (with probability
    `fraction`, decided by (seed, record id) alone) the id an earlier record carried, up to
    RESEND_WINDOW records back. The distinct ids of records a .. b-1 are {dedup_source_id(n) for n}."""
    while record_id > 0:
        draw = random.Random((seed << 40) ^ record_id ^ 0x5EED)
        if draw.random() >= fraction:
            return record_id
        record_id = max(0, record_id - 1 - draw.randrange(RESEND_WINDOW))
    return record_id


def dedup_record(record_id: int, keys: int, now: float, fraction: float = DEFAULT_DUPLICATES,
                 seed: int = 0) -> tuple[bytes, bytes]:
    """A demo record whose id may repeat an earlier one (`dedup_source_id`); the key follows the id."""
    return demo_record(dedup_source_id(record_id, fraction, seed), keys, now)


def join_record(record_id: int, keys: int, now: float) -> tuple[bytes, bytes]:
    """Order record_id // 2's order (even ids) or payment (odd ids), keyed by the order."""
    order = record_id // 2
    key = f"k{order % keys}"
    side = "order" if record_id % 2 == 0 else "payment"
    value = {"id": record_id, "key": key, "ts": now, "side": side, "order": order}
    return key.encode(), json.dumps(value, separators=(",", ":")).encode()


RECORD_KINDS = ("demo", "dedup", "join", "nexmark")


def record_maker(spec: str = "demo") -> RecordMaker:
    """The record maker a spec names: demo, dedup[:FRACTION], join or nexmark[:SEED] (see the module doc)."""
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    try:
        if kind == "demo" and not arg:
            return demo_record
        if kind == "join" and not arg:
            return join_record
        if kind == "dedup":
            fraction = float(arg) if arg else DEFAULT_DUPLICATES
            if not 0.0 <= fraction < 1.0:
                raise ValueError("the duplicate fraction must be in [0, 1)")
            return partial(dedup_record, fraction=fraction)
        if kind == "nexmark":
            return partial(nexmark_record, config=NexmarkConfig(seed=int(arg) if arg else 0))
    except ValueError as exc:
        raise ValueError(f"bad records {spec!r}: {exc}") from None
    raise ValueError(f"unknown records {spec!r}: demo, dedup[:FRACTION], join or nexmark[:SEED]")


# ---------------------------------------------------------------- the sender


@dataclass
class LoadResult:
    produced: int
    seconds: float
    start_id: int
    next_id: int
    began_at: float = 0.0  # wall time (epoch seconds) the first records were due

    @property
    def rate(self) -> float:
        return self.produced / self.seconds if self.seconds > 0 else 0.0


# The producer sends a partition's records at most every LINGER_MS, as one record batch. Record
# timestamps still follow the shape (records are created on time); only their delivery is grouped.
# Why not Kafka's usual 5 ms: the embedded broker (tansu 0.6, memory storage) lists every record batch
# a partition has ever stored on each Fetch and ListOffsets, and it deletes nothing, so each request
# costs in proportion to the batches stored: fewer, larger batches keep it from saturating a core
# (docs/spark.md, "Why the live job slowed down").
LINGER_MS = 250.0


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
    linger_ms: float = LINGER_MS,
    record: RecordMaker = demo_record,
) -> LoadResult:
    """Produce records (`record`, default demo records) following `shape` until its end, `duration_s`,
    or `stop_event`.

    `security`: SASL/SSL client properties (infra.security.kafka_security_config). `linger_ms`: how long
    the producer gathers records into one batch per partition (see LINGER_MS)."""
    from confluent_kafka import Producer

    from infra.kafka import ensure_topic

    duration = duration_s if duration_s is not None else shape.duration_s
    if duration is None:
        raise ValueError("this shape has no end: give a duration")
    if keys < 1:
        raise ValueError("keys must be at least 1")
    ensure_topic(bootstrap, topic, partitions, security=security)
    producer = Producer({
        "bootstrap.servers": bootstrap, **(security or {}), "linger.ms": linger_ms, "enable.idempotence": True,
    })
    stop_event = stop_event or threading.Event()
    next_id = start_id
    budget = 0.0
    began, began_at = time.monotonic(), time.time()
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
            key, value = record(next_id, keys, wall)
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
    return LoadResult(next_id - start_id - remaining, time.monotonic() - began, start_id, next_id, began_at)

"""Workload traces: the one loader of trace files, the built-in traces, and their replay per window.

A trace file is CSV with one rate per row in its last column: Daedalus's `second|count`, the
load-prediction `date,messages`, or `seconds,rate`; a header row is skipped. Built-in traces are
the five real traces in evaluation/traces (provenance in its README), pmdarima's `taylor`, and two
synthetic shapes (`steps`, `spikes`).
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
EPSILON = 1e-9
TRACE_NAMES = ("sine", "cos", "avazu", "iot", "wiki", "taylor", "steps", "spikes")
SHARED_TRACES = ("sine", "cos", "avazu", "iot", "wiki")  # the five real traces in evaluation/traces
TRACE_FILES = {"sine": "sine_60000_6h.csv", "cos": "cos_40000_6h.csv", "avazu": "avazu_5min.csv",
               "iot": "IoT_5min.csv", "wiki": "wiki_en_5min.csv"}
ROW_SECONDS = {"sine": 1.0, "cos": 1.0, "avazu": 25.0, "iot": 25.0, "wiki": 25.0, "taylor": 30.0}
NATIVE_ROW_SECONDS = {"sine": 1.0, "cos": 1.0, "avazu": 300.0, "iot": 300.0, "wiki": 300.0, "taylor": 1800.0}


def read_rates(path: str | Path) -> list[float]:
    """The value column (the last one) of a `second|count`, `date,messages` or `seconds,rate` trace."""
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


def scale_rates(
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


@dataclass(frozen=True)
class Trace:
    name: str
    rates: np.ndarray  # records/s per window
    window_s: float
    description: str
    sha256: str | None = None

    @property
    def duration_s(self) -> float:
        return len(self.rates) * self.window_s


def _synthetic(name: str, seconds: int) -> np.ndarray:
    t = np.arange(seconds, dtype=float)
    if name == "steps":  # a level every 30 minutes, up and down
        levels = np.array([0.2, 0.6, 0.3, 1.0, 0.5, 0.8, 0.15, 0.7, 0.4, 0.9, 0.25, 0.55])
        return levels[(t // 1800).astype(int) % len(levels)]
    # spikes: a quiet base with a 3-minute burst to the peak every 45 minutes
    return np.where((t % 2700) >= 2520, 1.0, 0.3)


def recorded_trace(name: str) -> tuple[np.ndarray, str, str | None]:
    """A recorded built-in trace's rows (one rate per row, at `NATIVE_ROW_SECONDS[name]`), where they
    come from, and the file's sha256."""
    if name == "taylor":
        import pmdarima as pm

        return np.asarray(pm.datasets.load_taylor(), dtype=float), "pmdarima.datasets.load_taylor()", None
    if name not in TRACE_FILES:
        raise ValueError(f"unknown recorded trace {name!r}; known: {', '.join([*TRACE_FILES, 'taylor'])}")
    path = TRACES / TRACE_FILES[name]
    return np.asarray(read_rates(path), dtype=float), TRACE_FILES[name], hashlib.sha256(path.read_bytes()).hexdigest()


def load_trace(name: str, hours: float = 6.0, peak: float = 1400.0, low_fraction: float = 0.125,
               window_s: float = 10.0, row_seconds: float | None = None) -> Trace:
    """`hours` of replay as one arrival rate per window, the trace's min..max mapped linearly onto
    `low_fraction` x peak .. peak (the shape is kept). One row of the trace lasts `row_seconds` of
    replay (default `ROW_SECONDS`: slower traces are time-compressed)."""
    seconds = round(hours * 3600)
    digest = None
    if name in ("steps", "spikes"):
        raw, row_s, what = _synthetic(name, seconds), 1.0, f"synthetic {name}"
    else:
        values, source, digest = recorded_trace(name)
        row_s = row_seconds or ROW_SECONDS[name]
        rows = min(len(values), math.ceil(seconds / row_s))
        raw = values[:rows]
        compression = NATIVE_ROW_SECONDS[name] / row_s
        covered = rows * NATIVE_ROW_SECONDS[name] / 3600
        what = (f"{source}: first {covered:g} h of the trace" + (
            f", {compression:g}x compressed (one {NATIVE_ROW_SECONDS[name]:g}-s row = {row_s:g} s)"
            if compression > 1 else " in real time"))
    mapped = np.asarray(scale_rates(list(raw), low=low_fraction * peak, high=peak))
    windows = math.ceil(seconds / window_s - EPSILON)
    midpoints = (np.arange(windows) + 0.5) * window_s
    if row_s >= window_s:
        rates = np.interp(midpoints, (np.arange(len(mapped)) + 0.5) * row_s, mapped)
    else:  # average the rows of each window
        per = round(window_s / row_s)
        usable = mapped[: (len(mapped) // per) * per]
        rates = usable.reshape(-1, per).mean(axis=1)[:windows]
    return Trace(name, rates, window_s, what, digest)

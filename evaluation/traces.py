"""Workload traces: the one loader of trace files, the built-in traces, and their replay per window.

A trace is a `Series`: one arrival rate per row, rows a fixed number of seconds apart. It comes
from a user's file (`read_trace_file`: CSV with a `seconds,rate` header; missing rows refused, or filled
on request by `fill_gaps`), from a built-in trace
(`builtin_series`: the five real traces in evaluation/traces, provenance in its README; pmdarima's
`taylor`; the synthetic ones of `evaluation.synthetic`), or from the load generator's files (`read_rates`).
The synthetic ones are 1-s shapes made as long as the replay (`step-up`, `drop`, `steps`, `spikes`) and
two fixed 21-day traces of 5-minute rows replayed like the recorded ones (`jumpy`: a daily 3.2x cycle
and a weekly +-10 %, the rate moving 4.4 % from one row to the next at the median and 14 % at the 90th
percentile, mean-reverting heavy-tailed moves; `jumpy-bursty`: the same with bursts of 1.5-2.5x lasting
30-90 min). `DEFAULT_TRACES` are the ones `autoscaler evaluate` replays when none is named.

`replay` turns a series into one arrival rate per evaluation window:
- **Scaling** by one factor, keeping the trace's ratios: its peak (default) or its mean to the rate
  asked for. `stretch` (min..max onto 12.5 %..100 % of the peak) is an explicit option only: it
  turns a load that varies by 7 % into an 8x swing.
- **Regime** `compressed`: a row lasts at most `COMPRESSED_ROW_S` seconds of replay (5-minute rows
  play 12x faster), the same rule for every trace. `real-time`: a row lasts its own seconds, and
  between rows the rate keeps the short-term variability of the trace itself: the log-rate is
  interpolated between rows and each window gets a deviation drawn (with the seed) from the
  trace's own row-to-row deviations around its local level, not a straight line between points.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from evaluation.synthetic import JUMPY_DESCRIPTIONS, JUMPY_NAMES, JUMPY_ROW_S, jumpy, shape

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
EPSILON = 1e-9
COMPRESSED_ROW_S = 25.0  # compressed regime: a row lasts at most this long (a 5-minute row: 12x)
LOW_FRACTION = 0.125  # `stretch`: the trace's minimum goes to this fraction of the peak
TRACE_FILES = {"sine": "sine_60000_6h.csv", "cos": "cos_40000_6h.csv", "avazu": "avazu_5min.csv",
               "iot": "IoT_5min.csv", "wiki": "wiki_en_5min.csv"}
NATIVE_ROW_SECONDS = {"sine": 1.0, "cos": 1.0, "avazu": 300.0, "iot": 300.0, "wiki": 300.0, "taylor": 1800.0,
                      **dict.fromkeys(JUMPY_NAMES, JUMPY_ROW_S)}
SHARED_TRACES = tuple(TRACE_FILES)  # the five real traces in evaluation/traces
SYNTHETIC = ("step-up", "drop", "steps", "spikes")  # 1-s shapes, made `hours` long
TRACE_NAMES = (*SHARED_TRACES, "taylor", *SYNTHETIC, *JUMPY_NAMES)
DEFAULT_TRACES = (*SHARED_TRACES, "step-up", "drop", *JUMPY_NAMES)  # `autoscaler evaluate` with no --trace
Scaling = Literal["peak", "mean", "stretch"]
Regime = Literal["compressed", "real-time"]
REGIMES: tuple[Regime, ...] = ("compressed", "real-time")
GapFill = Literal["linear"]
GAP_FILLS: tuple[GapFill, ...] = ("linear",)
MAX_FILLED_GAP_ROWS = 12  # `fill_gaps`: a longer run of missing rows is refused (at 5-minute rows: an hour)
SAMPLING_TOLERANCE = 0.01  # a step within 1 % of the sampling (or, filling gaps, of a multiple of it) is on time


class TraceError(ValueError):
    """A trace file that cannot be replayed, with what is wrong and where."""


@dataclass(frozen=True)
class Series:
    """A recorded load: one rate (records/s) per row, `row_s` seconds apart."""

    name: str
    values: np.ndarray
    row_s: float
    source: str
    sha256: str | None = None
    filled: int = 0  # rows missing from the file and filled (`fill_gaps`)


@dataclass(frozen=True)
class Trace:
    """A replay: one arrival rate per window."""

    name: str
    rates: np.ndarray  # records/s per window
    window_s: float
    description: str
    sha256: str | None = None
    compression: float = 1.0  # seconds of the recorded load per second of replay

    @property
    def duration_s(self) -> float:
        return len(self.rates) * self.window_s


def read_rates(path: str | Path) -> list[float]:
    """The value column (the last one) of a `second|count`, `date,messages` or `seconds,rate` trace,
    header rows skipped: the load generator's lenient reader."""
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


def read_trace_file(path: str | Path, fill: GapFill | None = None) -> Series:
    """A user's trace: CSV with a header naming `seconds` (since the start) and `rate` (records/s),
    any regular sampling. Raises TraceError naming the problem and the line.

    The sampling is the median step between rows; every step must be within 1 % of it. A step of a
    whole number of samplings is missing rows: refused by default ("irregular sampling"); with
    `fill="linear"` they are filled (`fill_gaps`) and `Series.filled` counts them."""
    path = Path(path)
    if fill is not None and fill not in GAP_FILLS:
        raise TraceError(f"unknown gap fill {fill!r}; choose {', '.join(GAP_FILLS)}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8", errors="replace"))))
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise TraceError(f"{path}: empty file; expected a header `seconds,rate` and one row per sample")
    header = [cell.strip().lower() for cell in rows[0]]
    missing = [c for c in ("seconds", "rate") if c not in header]
    if missing:
        raise TraceError(f"{path}: header {rows[0]} lacks column(s) {', '.join(missing)}; expected `seconds,rate`")
    si, ri = header.index("seconds"), header.index("rate")
    if len(rows) < 3:
        raise TraceError(f"{path}: {len(rows) - 1} sample(s); at least 2 are needed to know the sampling")
    seconds, rates = [], []
    for line, row in enumerate(rows[1:], start=2):
        try:
            t, r = float(row[si]), float(row[ri])
        except (ValueError, IndexError):
            raise TraceError(f"{path}, line {line}: {row} is not two numbers under seconds,rate") from None
        if not (math.isfinite(t) and math.isfinite(r)):
            raise TraceError(f"{path}, line {line}: {row} is not finite")
        if t < 0:
            raise TraceError(f"{path}, line {line}: negative time {t:g} s")
        if r < 0:
            raise TraceError(f"{path}, line {line}: negative rate {r:g}")
        if seconds and t <= seconds[-1]:
            raise TraceError(f"{path}, line {line}: time {t:g} s is not after {seconds[-1]:g} s (rows must be sorted)")
        seconds.append(t)
        rates.append(r)
    if max(rates) <= 0:
        raise TraceError(f"{path}: every rate is 0")
    times = np.asarray(seconds)
    row_s = float(np.median(np.diff(times)))
    try:
        values, filled = fill_gaps(times, np.asarray(rates, dtype=float), row_s, allow=fill is not None)
    except GapError as exc:
        raise TraceError(f"{path}, line {exc.row + 2}: {exc}") from None
    return Series(path.stem, values, row_s, path.name, hashlib.sha256(raw).hexdigest(), filled)


class GapError(ValueError):
    """A step between two rows that `fill_gaps` cannot accept; `row` is the index of the row after it."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


def fill_gaps(seconds: np.ndarray, rates: np.ndarray, row_s: float, *, allow: bool = True,
              max_gap_rows: int = MAX_FILLED_GAP_ROWS) -> tuple[np.ndarray, int]:
    """The rates on the regular grid of `row_s` from the first row, and how many rows were filled.

    Pure. Every step between consecutive rows (sorted `seconds`) must be within `SAMPLING_TOLERANCE` of
    `row_s` (no row missing) or, when `allow`, of a whole multiple k x row_s: the k - 1 rows missing there
    are filled by linear interpolation between the rows on each side; the recorded rows keep their own
    rates. Raises GapError ("irregular sampling") for a step that is no whole multiple, for any missing
    row when not `allow`, and for a run of more than `max_gap_rows` missing rows (a straight line over a
    long outage would be made-up load)."""
    gaps = np.diff(seconds)
    multiples = np.maximum(np.rint(gaps / row_s), 1.0)
    late = np.abs(gaps - multiples * row_s) > SAMPLING_TOLERANCE * row_s + EPSILON  # no whole multiple
    off = late | ((multiples > 1) & (not allow))
    if off.any():
        worst = int(np.flatnonzero(off)[np.abs(gaps - row_s)[off].argmax()])
        gap = (multiples > 1) & ~late
        hint = "" if late[worst] else (f"; {int(multiples[worst]) - 1} row(s) missing there, "
                                       f"{int((multiples[gap] - 1).sum())} in {int(gap.sum())} gap(s) in all: "
                                       "--fill-gaps linear fills them")
        raise GapError(f"irregular sampling ({gaps[worst]:g} s after the previous row; most rows are {row_s:g} s "
                       f"apart){hint}", worst + 1)
    longest = int(multiples.argmax())
    if multiples[longest] - 1 > max_gap_rows:
        raise GapError(f"{int(multiples[longest]) - 1} rows missing before this one ({gaps[longest]:g} s "
                       f"after the previous row); at most {max_gap_rows} in a row are filled", longest + 1)
    index = np.concatenate(([0], np.cumsum(multiples).astype(np.int64)))  # each recorded row's place on the grid
    values = np.interp(np.arange(index[-1] + 1), index, rates)
    return values, int(index[-1] + 1 - len(rates))


def builtin_series(name: str, hours: float = 6.0) -> Series:
    """A built-in trace (`TRACE_NAMES`); the 1-s synthetic shapes are made `hours` long, the `jumpy` ones
    are fixed (`evaluation.synthetic.jumpy`). Only the recorded ones have a sha256 (of their file)."""
    if name in SYNTHETIC:
        return Series(name, shape(name, hours), 1.0, f"synthetic {name}")
    if name in JUMPY_NAMES:
        return Series(name, jumpy(bursty=name == "jumpy-bursty"), JUMPY_ROW_S, JUMPY_DESCRIPTIONS[name])
    if name == "taylor":
        import pmdarima as pm

        return Series(name, np.asarray(pm.datasets.load_taylor(), dtype=float), NATIVE_ROW_SECONDS[name],
                      "pmdarima.datasets.load_taylor()")
    if name not in TRACE_FILES:
        raise TraceError(f"unknown trace {name!r}; built-in: {', '.join(TRACE_NAMES)} (or pass a file)")
    path = TRACES / TRACE_FILES[name]
    return Series(name, np.asarray(read_rates(path), dtype=float), NATIVE_ROW_SECONDS[name], TRACE_FILES[name],
                  hashlib.sha256(path.read_bytes()).hexdigest())


def recorded_trace(name: str) -> tuple[np.ndarray, str, str | None]:
    """A recorded built-in trace's rows (at `NATIVE_ROW_SECONDS[name]`), its source and its sha256."""
    if name not in NATIVE_ROW_SECONDS:
        raise TraceError(f"unknown recorded trace {name!r}; known: {', '.join(NATIVE_ROW_SECONDS)}")
    series = builtin_series(name)
    return series.values, series.source, series.sha256


def scale_rates(
    values: Sequence[float],
    *,
    peak: float | None = None,
    mean: float | None = None,
    low: float | None = None,
    high: float | None = None,
) -> list[float]:
    """Scale a trace: by one factor to a peak or a mean (ratios kept), or linearly onto low..high."""
    if not len(values):
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


def own_deviations(values: np.ndarray, span: int = 5) -> np.ndarray:
    """The trace's short-term variability: each row's log deviation from its local level (the
    centred mean of `span` rows), rows at 0 left out."""
    positive = values[values > 0]
    if len(positive) < span + 1:
        return np.zeros(1)
    logs = np.log(positive)
    level = np.convolve(logs, np.ones(span) / span, mode="same")
    edge = span // 2
    return (logs - level)[edge: len(logs) - edge]


def window_means(rows: np.ndarray, row_s: float, window_s: float) -> np.ndarray:
    """The mean rate in each whole window of `window_s` of rows replayed `row_s` each, weighting a
    row split by a window boundary by its share: with 3.2 rows per window, window k covers rows
    3.2 k to 3.2 (k + 1), so the replay keeps the load generator's pace (rounding to 3 rows per window
    would fall behind by 0.2 rows a window)."""
    edges = np.arange(len(rows) + 1) * row_s
    records = np.concatenate(([0.0], np.cumsum(rows * row_s)))  # exact: rates are constant within a row
    count = math.floor(len(rows) * row_s / window_s + EPSILON)
    bounds = np.arange(count + 1) * window_s
    return np.diff(np.interp(bounds, edges, records)) / window_s


def load_generator_windows(rows: np.ndarray, row_s: float, window_s: float) -> np.ndarray:
    """The mean rate in each whole window of `window_s` as the load generator replays `rows` a row every
    `row_s` (`pipeline.loadgen.Replay`): row i's rate at i x row_s, linear to the next row's, the last row
    held over its own span. Exact: the integral of that piecewise-linear rate between window edges."""
    rows = np.asarray(rows, dtype=float)
    n = len(rows)
    following = np.append(rows[1:], rows[-1])
    records = np.concatenate(([0.0], np.cumsum((rows + following) / 2 * row_s)))
    count = math.floor(n * row_s / window_s + EPSILON)
    position = np.arange(count + 1) * window_s / row_s
    k = np.minimum(np.floor(position + EPSILON).astype(np.int64), n - 1)
    f = np.clip(position - k, 0.0, 1.0)
    cumulative = records[k] + row_s * (rows[k] * f + (following[k] - rows[k]) * f**2 / 2)
    return np.diff(cumulative) / window_s


def replay(series: Series, *, hours: float = 6.0, rate: float = 1400.0, scaling: Scaling = "peak",
           regime: Regime = "compressed", window_s: float = 10.0, seed: int = 0,
           row_replay_s: float | None = None, as_load_generator: bool = False) -> Trace:
    """`hours` of replay of `series` as one arrival rate per window (see the module docstring).

    The factor is taken over the replayed part, so `rate` is its peak (or mean). `row_replay_s`
    overrides the regime's row length (the live evaluation fits a number of rows into minutes).
    `as_load_generator`: the windows of what `autoscaler load run --trace` sends for the same rows
    (the live evaluation's load): the rows scaled one by one (the trace's minimum and maximum are its
    rows', not its windows'), linear between rows (`load_generator_windows`)."""
    if hours <= 0 or rate <= 0 or window_s <= 0:
        raise ValueError("hours, rate and window_s must be positive")
    seconds = round(hours * 3600)
    if row_replay_s is None:
        row_replay_s = series.row_s if regime == "real-time" else min(series.row_s, COMPRESSED_ROW_S)
    compression = series.row_s / row_replay_s
    rows = min(len(series.values), math.ceil(seconds / row_replay_s))
    raw = series.values[:rows]
    windows = math.ceil(seconds / window_s - EPSILON)
    midpoints = (np.arange(windows) + 0.5) * window_s
    if as_load_generator:
        scaled_rows = np.asarray(scale_rates(list(raw), **_scaling_arguments(scaling, rate)))
        return _trace(series, load_generator_windows(scaled_rows, row_replay_s, window_s)[:windows], window_s,
                      rows, row_replay_s, scaling, rate, compression)
    if row_replay_s < window_s:  # several rows per window: their mean over the window's own span
        shaped = window_means(raw, row_replay_s, window_s)[:windows]
    elif regime == "real-time" and row_replay_s > window_s:
        positive = np.maximum(raw, max(float(raw.max()) * 1e-6, EPSILON))
        level = np.exp(np.interp(midpoints, (np.arange(len(raw)) + 0.5) * row_replay_s, np.log(positive)))
        rng = np.random.default_rng(seed)
        wiggle = np.exp(rng.choice(own_deviations(series.values), size=windows))
        shaped = level * wiggle / wiggle.mean()
    else:
        shaped = np.interp(midpoints, (np.arange(len(raw)) + 0.5) * row_replay_s, raw)
    scaled = np.asarray(scale_rates(list(shaped), **_scaling_arguments(scaling, rate)))
    return _trace(series, scaled, window_s, rows, row_replay_s, scaling, rate, compression)


def _scaling_arguments(scaling: Scaling, rate: float) -> dict[str, float]:
    return {"low": LOW_FRACTION * rate, "high": rate} if scaling == "stretch" else {scaling: rate}


def _trace(series: Series, rates: np.ndarray, window_s: float, rows: int, row_replay_s: float, scaling: Scaling,
           rate: float, compression: float) -> Trace:
    covered = rows * series.row_s / 3600
    how = "in real time" if compression <= 1 + EPSILON else (
        f"{compression:g}x compressed (one {series.row_s:g}-s row = {row_replay_s:g} s)")
    what = f"{series.source}: first {covered:g} h, {how}, scaled to a {scaling} of {rate:g} rec/s"
    if series.filled:
        what += f" ({series.filled} missing rows filled linearly)"
    return Trace(series.name, rates, window_s, what, series.sha256, compression)


def resolve(name_or_path: str, hours: float = 6.0, fill: GapFill | None = None) -> Series:
    """A built-in trace by name, or a user's `seconds,rate` file by path (`fill`: see `read_trace_file`)."""
    if name_or_path in TRACE_NAMES:
        return builtin_series(name_or_path, hours)
    if Path(name_or_path).suffix or Path(name_or_path).exists():
        return read_trace_file(name_or_path, fill)
    raise TraceError(f"unknown trace {name_or_path!r}; built-in: {', '.join(TRACE_NAMES)} (or pass a file)")


def load_trace(name: str, hours: float = 6.0, peak: float = 1400.0, window_s: float = 10.0,
               regime: Regime = "compressed", seed: int = 0, scaling: Scaling = "peak",
               fill: GapFill | None = None) -> Trace:
    """A built-in trace or a file (`fill`: its missing rows, see `read_trace_file`), replayed (see `replay`)."""
    return replay(resolve(name, hours, fill), hours=hours, rate=peak, scaling=scaling, regime=regime,
                  window_s=window_s, seed=seed)

"""The built-in synthetic traces: rows of arrival rate made, not recorded (`evaluation.traces` serves them).

Shapes at one row a second, made as long as the replay (`shape`): `step-up`, `drop`, `steps`, `spikes`.

`jumpy` and `jumpy-bursty` (`jumpy`): 5-minute rows over 21 days (as the recorded wiki and IoT traces),
with the character of the public traces the planner is judged on (issue 41, item 4): the rate moves
about 4.4 % from one row to the next (median of |log(r_t / r_(t-1))|) and about 14 % at the 90th
percentile, around a daily cycle. The log-rate is a seasonal level plus a stationary AR(1) deviation
(Box & Jenkins, *Time Series Analysis*, ch. 3):

    log r_t = c(t) + w(t) + x_t,    x_t = 0.9 x_(t-1) + e_t,    e_t ~ Laplace(0, 0.058)

- c(t): the day, a cosine in the log-rate with its trough at 04:30 and its peak at 16:30, 3.2x apart;
- w(t): the week, +-10 % (a cosine in the log-rate, highest on Wednesdays, lowest on Saturday night);
  the first row is a Monday, 00:00;
- x_t: mean-reverting (a shock halves in about 6.6 rows, half an hour), so the level stays on the
  cycle, not a random walk; the Laplace innovations give the heavy tail (a move of 30 % or more
  every few hours). The AR(1) starts from a day of burn-in, so the first rows are as jumpy as the rest.

`jumpy-bursty` is `jumpy` (the same rows) times occasional level shifts: bursts 1.5-2.5x the level,
lasting 30-90 min (6-18 rows): the first at 03:00 on the first day (so that the real-time regime's
first 6 h hold one), then about two a day at Poisson times. Both are fixed: drawn from an
internal constant seed (`JUMPY_SEED`), the same for everyone; an evaluation's seed only adds the
per-window noise it adds to every trace. Only uniform doubles of numpy's PCG64 are used (Laplace and
exponential by their inverse CDFs), whose stream numpy keeps stable across versions.
"""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

JUMPY_NAMES = ("jumpy", "jumpy-bursty")
JUMPY_ROW_S = 300.0
ROWS_PER_DAY = round(86_400 / JUMPY_ROW_S)  # 288
JUMPY_DAYS = 21
JUMPY_SEED = 41  # issue 41: fixed, so that a built-in trace is the same for everyone
DAY_NIGHT = 3.2  # the daily cycle's peak over its trough
TROUGH_HOUR = 4.5
WEEKLY = 0.10  # the weekly swing, +- in the log-rate
AR = 0.9  # the deviation's persistence per row
INNOVATION = 0.058  # the Laplace scale b of the deviation's innovations (median |e| = b ln 2)
BURSTS_PER_DAY = 2.0
BURST_ROWS = (6, 18)  # 30-90 min
BURST_FACTOR = (1.5, 2.5)
FIRST_BURST_ROW = 36  # 03:00 on the first day: the real-time regime's first 6 h hold one
JUMPY_DESCRIPTIONS = {
    "jumpy": "synthetic jumpy: 5-min rows, 21 days, a daily 3.2x cycle and a weekly +-10 %, AR(1) Laplace "
             "moves (median 4.4 %, p90 14 % a row; fixed seed)",
    "jumpy-bursty": "synthetic jumpy-bursty: jumpy with bursts of 1.5-2.5x lasting 30-90 min, the first at 03:00, "
                    "then about two a day (fixed seed)",
}


def shape(name: str, hours: float) -> np.ndarray:
    """One row a second, `hours` long. `step-up`: a quarter of the peak, then the peak from the second hour
    on (x4); `drop`: the peak, then a quarter of it from the second hour on (/4); `steps`: a level every
    30 min; `spikes`: a quiet base with a 3-minute burst to the peak every 45 minutes."""
    t = np.arange(round(hours * 3600), dtype=float)
    if name == "step-up":
        return np.where(t < 3600, 0.25, 1.0)
    if name == "drop":
        return np.where(t < 3600, 1.0, 0.25)
    if name == "steps":
        levels = np.array([0.2, 0.6, 0.3, 1.0, 0.5, 0.8, 0.15, 0.7, 0.4, 0.9, 0.25, 0.55])
        return levels[(t // 1800).astype(int) % len(levels)]
    return np.where((t % 2700) >= 2520, 1.0, 0.3)


def log_moves(values: np.ndarray) -> np.ndarray:
    """|log(r_t / r_(t-1))| for each pair of consecutive rows (all rates positive): the row-to-row move."""
    return np.abs(np.diff(np.log(np.asarray(values, dtype=float))))


def laplace(uniforms: np.ndarray, scale: float) -> np.ndarray:
    """Laplace(0, `scale`) draws from uniforms in [0, 1), by the inverse CDF; a uniform of 0 (whose
    quantile is -infinity) is taken as 2^-54, the least the CDF then reaches."""
    centred = np.maximum(uniforms, 2.0**-54) - 0.5
    return -scale * np.sign(centred) * np.log1p(-2 * np.abs(centred))


def ar1(innovations: np.ndarray, phi: float) -> np.ndarray:
    """x_t = phi x_(t-1) + e_t from x = 0 before the first innovation (scipy's IIR filter 1 / (1 - phi B))."""
    return np.asarray(lfilter([1.0], [1.0, -phi], innovations))


def seasonal(rows: int) -> np.ndarray:
    """The log-level of the daily and weekly cycles at each 5-minute row, the first row Monday 00:00."""
    days = np.arange(rows) / ROWS_PER_DAY
    daily = -np.log(DAY_NIGHT) / 2 * np.cos(2 * np.pi * (days - TROUGH_HOUR / 24))
    weekly = WEEKLY * np.cos(2 * np.pi * (days - 2.5) / 7)  # highest Wednesday noon, lowest Saturday night
    return daily + weekly


def bursts(rng: np.random.Generator, rows: int) -> np.ndarray:
    """The log-factor of the bursts at each row: 0 outside them; the first starts at `FIRST_BURST_ROW`, the
    next ones at Poisson times (`BURSTS_PER_DAY`) after the end of the one before; each lasts `BURST_ROWS`
    at a factor log-uniform in `BURST_FACTOR`."""
    out = np.zeros(rows)
    at = float(FIRST_BURST_ROW)
    while True:
        start = int(at)
        if start >= rows:
            return out
        length = BURST_ROWS[0] + int(rng.random() * (BURST_ROWS[1] - BURST_ROWS[0] + 1))
        low, high = np.log(BURST_FACTOR)
        out[start: start + length] = low + rng.random() * (high - low)
        at = start + length - np.log1p(-rng.random()) * ROWS_PER_DAY / BURSTS_PER_DAY


def jumpy(bursty: bool = False, days: int = JUMPY_DAYS) -> np.ndarray:
    """The `jumpy` trace's rows (or `jumpy-bursty`'s: the same rows times its bursts), `days` of
    5-minute rows, positive, a level around 1 (the replay scales it). Pure and fixed (`JUMPY_SEED`); a
    shorter trace is the longer one's first rows. See the module docstring."""
    rows = days * ROWS_PER_DAY
    rng = np.random.default_rng(JUMPY_SEED)
    innovations = laplace(rng.random(ROWS_PER_DAY + rows), INNOVATION)
    deviation = ar1(innovations, AR)[ROWS_PER_DAY:]  # a day of burn-in
    logs = seasonal(rows) + deviation
    if bursty:
        logs = logs + bursts(np.random.default_rng(JUMPY_SEED + 1), rows)
    return np.exp(logs)

"""Where a policy's cost above the clairvoyant oracle comes from: its slot-second gap, window by window.

Pure: no I/O. Issue 41 (item 1) asks which part of the gap to the oracle (`evaluation.oracle`) is safety
margin, measuring holds, late scale-downs, early scale-ups and rescales undone within minutes. Both
schedules are per metric window (the simulator's `Timeline.parallelism`, the oracle's parallelism at one
step per window: both change only at window ends). In window i the policy holds p[i] slots and the oracle
o[i]; the difference d[i] = p[i] - o[i], times the window's length, goes to exactly one category, tried in
this order:

1. `below` (d < 0): the policy holds fewer slots than the oracle. Negative: slot-seconds saved and paid in
   backlog (the oracle is the cheapest schedule within the target). Every window below the oracle is
   here, whatever the reason.
2. `undone` (d > 0): the window lies in an upward excursion the load did not call for: a run of the
   policy at one level, entered by a scale-up and left by a scale-down at most UNDONE_WITHIN_S seconds
   later (from the first window at the level to the first after it), while the oracle stays below that
   level from HORIZON_S before the run to HORIZON_S after it. The whole excess of its windows is here.
   (An excursion the oracle makes too follows the load: its windows go by the rules below.)
3. `measuring` (d > 0): the decision that set the window's parallelism (taken at the end of the window
   before) was a hold waiting to measure: its reason code is one of MEASURING_CODES (the default planner's
   windows ignored after a restart, its capacity measurement after a rescale, its wait for a new arrival
   level's windows, or no capacity measured yet; `plan.guarded.admit`, `plan.gates`). Known only when the
   run's reason codes are given (`reasons`); without them these windows fall to the categories below. A
   measuring hold holds whatever the policy would have done, so this is the excess the policy had while
   it could not act, not what acting would have saved.
4. `oracle_dip` (d > 0): the oracle held at least p[i] within the last HORIZON_S seconds and does again
   within the next HORIZON_S: it leaves the policy's level for a few minutes and comes back. The oracle
   knows each window's load and rate noise in advance, and dips where they allow; a policy that sees them
   only afterwards holds through.
5. `early_scale_up` (d > 0): the oracle rises to at least p[i] within the next HORIZON_S seconds (the
   policy scaled up, or stayed up, ahead of the load).
6. `late_scale_down` (d > 0): the oracle held at least p[i] within the last HORIZON_S seconds (the policy
   comes down after the load did: its scale-down delay, holds for no real gain, one step at a time).
7. `margin` (d > 0): the rest: the policy steadily above the oracle, the slots its safe-side estimates buy
   (the arrival level's upper quantile, the capacity less its noise: docs/policies.md, the default).

`timing`: a run's slot-seconds as the simulator pays them, less the oracle's, less the sum of d[i] x window
(any sign). Zero when both pay a whole window per parallelism, as the suite's fused job does; else
(rescales paid within windows, per-operator slots) the remainder, so the parts always sum to the gap.

Counts: `actions` (changes of the policy's schedule) and `oracle_actions` (the oracle's); `undone_rescales`,
the policy's runs entered and left in opposite directions (up then down, or down then up) within
UNDONE_WITHIN_S, whether or not the oracle made the same trip: each is one action undone by the next;
`oracle_undone_rescales`, the oracle's (it undoes rescales too, where the load comes and goes). A dip (down
then up) is counted but its windows go by the rules above (below the oracle, or whatever kept the policy
above it).

`excess_by_reason`: the positive excess (d > 0) by the reason code of the decision that set each window's
parallelism (NO_DECISION where none did: the first window, a window after one the job did not report in).
A second view of the same excess, not a part of the sum.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from plan.gates import LevelHold, MeasuringHold

if TYPE_CHECKING:
    from evaluation.simulator import PolicyRun

UNDONE_WITHIN_S = 300.0  # a level left again in the opposite direction this soon undid the rescale into it
HORIZON_S = 300.0  # the oracle's level this close ahead (behind) makes an excess an early scale-up (late scale-down)
MEASURING_CODES: tuple[str, ...] = ("stabilizing", "stale_window", "learning", *MeasuringHold.codes, *LevelHold.codes)
NO_DECISION = "(no decision)"
PARTS = ("undone", "measuring", "oracle_dip", "early_scale_up", "late_scale_down", "margin", "below", "timing")
WINDOW_PARTS = PARTS[:-1]  # the categories a window's difference goes to
_EPSILON = 1e-9


@dataclass(frozen=True)
class GapDecomposition:
    """A policy's slot-seconds above the oracle's, in parts that sum to `gap` (see the module docstring).
    Every part and the gap are slot-seconds; `oracle_slot_seconds` is the oracle's cost, the scale of the
    shares (`shares`)."""

    gap: float
    oracle_slot_seconds: float
    undone: float
    measuring: float
    oracle_dip: float
    early_scale_up: float
    late_scale_down: float
    margin: float
    below: float
    timing: float
    actions: int
    oracle_actions: int
    undone_rescales: int
    oracle_undone_rescales: int
    excess_by_reason: Mapping[str, float] = field(default_factory=dict)

    def parts(self) -> dict[str, float]:
        """The parts, in the order of PARTS; they sum to `gap`."""
        return {name: getattr(self, name) for name in PARTS}

    def shares(self) -> dict[str, float]:
        """The gap and each part as a share of the oracle's cost (0 for an oracle that costs nothing)."""
        scale = self.oracle_slot_seconds
        values = {"gap": self.gap, **self.parts()}
        return {name: value / scale if scale > 0 else 0.0 for name, value in values.items()}

    def as_dict(self) -> dict[str, Any]:
        """For JSON: slot-seconds rounded to 0.001 (so the rounded parts sum to the gap within 0.01)."""
        return {"gap": round(self.gap, 3), "oracle_slot_seconds": round(self.oracle_slot_seconds, 3),
                **{name: round(value, 3) for name, value in self.parts().items()},
                "actions": self.actions, "oracle_actions": self.oracle_actions,
                "undone_rescales": self.undone_rescales, "oracle_undone_rescales": self.oracle_undone_rescales,
                "excess_by_reason": {k: round(v, 3) for k, v in self.excess_by_reason.items()}}


def _windows(seconds: float, window_s: float) -> int:
    return max(0, math.floor(seconds / window_s + _EPSILON))


def _runs(schedule: np.ndarray) -> list[tuple[int, int]]:
    """The schedule's runs at one level: (first window, first window after), in order."""
    starts = [0, *(int(i) + 1 for i in np.flatnonzero(np.diff(schedule))), len(schedule)]
    return list(itertools.pairwise(starts))


def undone_runs(schedule: Sequence[int], window_s: float,
                within_s: float = UNDONE_WITHIN_S) -> list[tuple[int, int, int]]:
    """The runs of `schedule` entered and left in opposite directions, at most `within_s` apart: (first window,
    first window after, +1 for an upward excursion or -1 for a dip). The first and last runs are never
    excursions (the schedule's start and end are not rescales)."""
    p = np.asarray(schedule, dtype=int)
    out = []
    for start, end in _runs(p):
        if start == 0 or end == len(p) or (end - start) * window_s > within_s + _EPSILON:
            continue
        entered, left = np.sign(p[start] - p[start - 1]), np.sign(p[end] - p[end - 1])
        if entered == -left:
            out.append((start, end, int(entered)))
    return out


def _reach(oracle: np.ndarray, h: int, ahead: bool) -> np.ndarray:
    """Per window, the oracle's highest level over the next (ahead) or last `h` windows; -1 where none."""
    n = len(oracle)
    if h == 0:
        return np.full(n, -1)
    pad = np.full(h, -1)
    padded = np.concatenate([oracle[1:], pad]) if ahead else np.concatenate([pad, oracle])
    return sliding_window_view(padded, h).max(axis=1)[:n]


def window_categories(policy: Sequence[int], oracle: Sequence[int], window_s: float,
                      reasons: Sequence[str | None] | None = None, *, undone_within_s: float = UNDONE_WITHIN_S,
                      horizon_s: float = HORIZON_S) -> list[str | None]:
    """Per window, the category (one of WINDOW_PARTS) its difference goes to, None where the policy holds
    the oracle's parallelism (see the module docstring for the rules and their order)."""
    p, o = np.asarray(policy, dtype=int), np.asarray(oracle, dtype=int)
    if p.shape != o.shape:
        raise ValueError(f"the schedules differ in length: {len(p)} and {len(o)} windows")
    if reasons is not None and len(reasons) != len(p):
        raise ValueError(f"{len(reasons)} reasons for {len(p)} windows")
    h = _windows(horizon_s, window_s)
    undone = np.zeros(len(p), dtype=bool)
    for start, end, direction in undone_runs(p, window_s, undone_within_s):
        if direction > 0 and o[max(0, start - h):end + h].max() < p[start]:
            undone[start:end] = True
    ahead, behind = _reach(o, h, ahead=True), _reach(o, h, ahead=False)
    out: list[str | None] = []
    for i in range(len(p)):
        if p[i] == o[i]:
            out.append(None)
        elif p[i] < o[i]:
            out.append("below")
        elif undone[i]:
            out.append("undone")
        elif reasons is not None and reasons[i] in MEASURING_CODES:
            out.append("measuring")
        elif ahead[i] >= p[i] and behind[i] >= p[i]:
            out.append("oracle_dip")
        elif ahead[i] >= p[i]:
            out.append("early_scale_up")
        elif behind[i] >= p[i]:
            out.append("late_scale_down")
        else:
            out.append("margin")
    return out


def _median(values: list[float]) -> float:
    return round(float(np.median(values)), 4)


def _changes(schedule: np.ndarray) -> int:
    return int(np.count_nonzero(np.diff(schedule)))


def decompose(policy: Sequence[int], oracle: Sequence[int], window_s: float, *,
              reasons: Sequence[str | None] | None = None, policy_slot_seconds: float | None = None,
              oracle_slot_seconds: float | None = None, undone_within_s: float = UNDONE_WITHIN_S,
              horizon_s: float = HORIZON_S) -> GapDecomposition:
    """The gap between two per-window schedules of equal length (slots; windows of `window_s` seconds), in
    the parts of the module docstring. `reasons`: per window, the reason code of the decision that set its
    parallelism (None: no decision; `reasons_per_window`). `policy_slot_seconds` and `oracle_slot_seconds`:
    what each cost as paid (the run's and the oracle's `slot_seconds`); each defaults to its schedule's
    slots x `window_s`. The gap is their difference; `timing` is what the windows' differences leave of it."""
    p, o = np.asarray(policy, dtype=int), np.asarray(oracle, dtype=int)
    categories = window_categories(p, o, window_s, reasons, undone_within_s=undone_within_s, horizon_s=horizon_s)
    slots = dict.fromkeys(WINDOW_PARTS, 0)
    excess: dict[str, int] = {}
    for i, category in enumerate(categories):
        if category is None:
            continue
        d = int(p[i] - o[i])
        slots[category] += d
        if d > 0:
            code = (reasons[i] if reasons is not None else None) or NO_DECISION
            excess[code] = excess.get(code, 0) + d
    policy_cost = float(p.sum()) * window_s if policy_slot_seconds is None else policy_slot_seconds
    oracle_cost = float(o.sum()) * window_s if oracle_slot_seconds is None else oracle_slot_seconds
    gap = policy_cost - oracle_cost
    timing = gap - float(p.sum() - o.sum()) * window_s
    return GapDecomposition(
        gap=gap, oracle_slot_seconds=oracle_cost, **{k: v * window_s for k, v in slots.items()}, timing=timing,
        actions=_changes(p), oracle_actions=_changes(o), undone_rescales=len(undone_runs(p, window_s, undone_within_s)),
        oracle_undone_rescales=len(undone_runs(o, window_s, undone_within_s)),
        excess_by_reason={code: d * window_s for code, d in sorted(excess.items(), key=lambda kv: -kv[1])})


def reasons_per_window(decided: Iterable[tuple[float, str]], window_s: float, windows: int) -> list[str | None]:
    """Per window, the reason code of the decision that set its parallelism: the one taken at the end of the
    window before (`decided`: (seconds since the start at the decided window's end, code), as
    `evaluation.simulator.PolicyRunner.decided` records them); None where no decision was taken."""
    out: list[str | None] = [None] * windows
    for at_s, code in decided:
        i = round(at_s / window_s)
        if 0 <= i < windows:
            out[i] = code
    return out


def gap_of_run(run: PolicyRun, decided: Iterable[tuple[float, str]], oracle: Sequence[int],
               oracle_slot_seconds: float) -> GapDecomposition:
    """`decompose` for a simulated run (`evaluation.simulator.simulate`: its whole timeline, every window)
    against the oracle's per-window schedule and cost; `decided` is the run's `PolicyRunner.decided`."""
    timeline = run.timeline
    reasons = reasons_per_window(decided, timeline.window_s, len(timeline.parallelism))
    return decompose(timeline.parallelism, oracle, timeline.window_s, reasons=reasons,
                     policy_slot_seconds=run.slot_seconds, oracle_slot_seconds=oracle_slot_seconds)


def summarize_gaps(cases: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """Per trace and regime (in the cases' order), `policy`'s decomposition (each case's run row's "gap", as
    `evaluation.suite.evaluate_case` writes it) over the seeds: the median of the gap and of each part as a
    share of the oracle's cost (medians, so the parts need not sum to the gap's), and the medians of the
    undone rescales, the policy's actions and the oracle's. Cases without that policy are left out."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for case in cases:
        row = next((r for r in case["runs"] if r["policy"] == policy and "gap" in r), None)
        if row is not None:
            groups.setdefault((case["trace"], case["regime"]), []).append(row["gap"])
    out = []
    for (trace, regime), gaps in groups.items():
        shares = {name: _median([g[name] / g["oracle_slot_seconds"] if g["oracle_slot_seconds"] > 0 else 0.0
                                for g in gaps]) for name in ("gap", *PARTS)}
        counts = {key: _median([g[key] for g in gaps])
                  for key in ("undone_rescales", "oracle_undone_rescales", "actions", "oracle_actions")}
        out.append({"trace": trace, "regime": regime, "policy": policy, "seeds": len(gaps), "shares": shares,
                    **counts})
    return out

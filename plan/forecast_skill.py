"""Whether the arrival-rate forecast has earned trust: its predicted change over the next minutes,
checked against the change that came.

The planner uses a forecast as a relative change from the measured level (see
`plan.policies.default.planned_rates`), so that is what is scored: each minute the forecast's
predicted ratio `LEAD_S` ahead (its value then over its first value) is noted with the level; when
that time comes, the error is log(level then / level noted) - log(predicted ratio). The forecast is
trusted while it has been scored `MIN_SCORES` times and the median absolute error of the last
`KEPT` is at most `MAX_ERROR`. A forecast fitted across a level shift (it reverts to the old mean)
or one that misses the load's changes loses trust within minutes, and regains it by predicting well.
Its upper quantile is used no wider than its errors have been (`band`): a forecaster's interval that
is wide because its fit spans a level shift does not inflate a steady load.
The one-step WAPE that analyze reports cannot see either: it scores the next point only.

Pure: `note` returns the new state; the state is a small pydantic model kept in the plan state.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from contracts.analyses import ForecastView

LEAD_S = 600.0  # how far ahead the predicted change is scored
MIN_SCORES = 3
NOTE_EVERY_S = 60.0
KEPT = 10
MAX_ERROR = 0.1  # median absolute log error: about 10 % of the level


class ForecastSkill(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pending: list[tuple[float, float, float]] = Field(default_factory=list)  # (due, level noted, predicted ratio)
    errors: list[float] = Field(default_factory=list)
    last_noted: float | None = None  # when a forecast was last noted (at most one a minute)

    def band(self) -> float:
        """How far above its point forecast the forecast has been seen to err: the 90th percentile of the
        absolute log errors kept (0 before any score)."""
        if not self.errors:
            return 0.0
        return float(np.quantile(np.abs(self.errors[-KEPT:]), 0.9))

    def median_error(self) -> float | None:
        """The median absolute log error of the last `KEPT` scores; None before `MIN_SCORES`."""
        if len(self.errors) < MIN_SCORES:
            return None
        return statistics.median(abs(e) for e in self.errors[-KEPT:])

    def trusted(self) -> bool:
        error = self.median_error()
        return error is not None and error <= MAX_ERROR


def note(skill: ForecastSkill, now: float, level: float | None, forecast: ForecastView | None) -> ForecastSkill:
    """Score the predictions that fell due by `now` against the level, and note this forecast's."""
    if level is None or level <= 0:
        return skill
    errors = list(skill.errors)
    pending = []
    for due, noted, ratio in skill.pending:
        if due <= now:
            errors.append(math.log(level / noted) - math.log(ratio))
        else:
            pending.append((due, noted, ratio))
    last_noted = skill.last_noted
    due_to_note = last_noted is None or now - last_noted >= NOTE_EVERY_S
    if forecast is not None and forecast.values and forecast.values[0] > 0 and due_to_note:
        index = round(LEAD_S / forecast.step_s) - 1
        if 0 <= index < len(forecast.values) and forecast.values[index] > 0:
            due = forecast.start + index * forecast.step_s
            pending.append((due, level, forecast.values[index] / forecast.values[0]))
        last_noted = now
    return skill.model_copy(update={"pending": pending[-2 * KEPT:], "errors": errors[-KEPT:],
                                    "last_noted": last_noted})

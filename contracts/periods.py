"""Excluded periods: time ranges in which a job is never rescaled (e.g. a batch window, a sale).

Entries are separated by `;`, all in UTC:
- `22:00-06:00`: every day (a range that ends before it starts wraps past midnight);
- `Sat,Sun 00:00-24:00` or `Mon-Fri 09:00-10:00`: on those weekdays (by the day the range starts);
- `2026-12-24T00:00/2026-12-27T00:00`: one absolute range, ISO 8601.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")


class PeriodError(ValueError):
    pass


@dataclass(frozen=True)
class DailyPeriod:
    start_min: int
    end_min: int
    weekdays: frozenset[int]
    text: str

    def contains(self, at: datetime) -> bool:
        minute = at.hour * 60 + at.minute + at.second / 60
        if self.start_min < self.end_min:
            return at.weekday() in self.weekdays and self.start_min <= minute < self.end_min
        # Wraps midnight: the tail belongs to the previous day's range.
        if minute >= self.start_min:
            return at.weekday() in self.weekdays
        return minute < self.end_min and (at.weekday() - 1) % 7 in self.weekdays


@dataclass(frozen=True)
class AbsolutePeriod:
    start: datetime
    end: datetime
    text: str

    def contains(self, at: datetime) -> bool:
        return self.start <= at < self.end


Period = DailyPeriod | AbsolutePeriod


def _weekdays(spec: str) -> frozenset[int]:
    days: set[int] = set()
    for part in spec.lower().split(","):
        first, _, last = part.strip().partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise PeriodError(f"unknown weekday in {spec!r}; use {', '.join(d.title() for d in DAYS)}")
        a, b = DAYS.index(first), DAYS.index(last or first)
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(days)


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise PeriodError(f"not an ISO 8601 time: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_period(text: str) -> Period:
    entry = text.strip()
    if "/" in entry:
        start_text, _, end_text = entry.partition("/")
        start, end = _instant(start_text.strip()), _instant(end_text.strip())
        if end <= start:
            raise PeriodError(f"{entry!r} ends before it starts")
        return AbsolutePeriod(start, end, entry)
    days_spec, _, clock = entry.rpartition(" ")
    match = _CLOCK.match(clock)
    if not match:
        raise PeriodError(f"expected HH:MM-HH:MM, [days] HH:MM-HH:MM or start/end in ISO 8601, got {entry!r}")
    h1, m1, h2, m2 = map(int, match.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2):
        raise PeriodError(f"not a time of day in {entry!r}")
    start_min, end_min = h1 * 60 + m1, h2 * 60 + m2
    if start_min == end_min:
        raise PeriodError(f"{entry!r} is empty")
    weekdays = _weekdays(days_spec) if days_spec.strip() else frozenset(range(7))
    return DailyPeriod(start_min, end_min, weekdays, entry)


def parse_periods(text: str) -> list[Period]:
    return [parse_period(entry) for entry in text.split(";") if entry.strip()]


def excluded_at(timestamp: float, periods: list[Period]) -> Period | None:
    at = datetime.fromtimestamp(timestamp, tz=UTC)
    return next((p for p in periods if p.contains(at)), None)

"""Exactly-once checks of a workload's output against its input; pure.

`check(name, inputs, outputs, options, closed_before)` takes the input records (parsed JSON, in any order)
and the output records as read from the output topic (parsed JSON), and computes from the input alone what
a run without restarts, rescales or failures writes: the ids a stateless or deduplicating query passes,
the (window, key) counts of a windowed one, the joined pairs, the sessions. Windows and sessions that end
after `closed_before` (event time, epoch s) are left out: the watermark may not have passed them.

The result counts input records: `lost` the ones the output misses, `duplicated` the ones it has more than
once (a cell written twice counts all its records), `mismatched` the output items whose content differs
from what was expected (e.g. an id checksum) and `unexpected` the items no run would write.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.workloads.common import WorkloadOptions, output_rows
from pipeline.workloads.nexmark_queries import EUR_PER_USD, Q2_AUCTION_SKIP, Q5_DEFAULTS, hot_items

_MICROS = 1_000_000


@dataclass(frozen=True)
class CheckResult:
    expected: int  # input records the output should account for
    written: int  # input records the output accounts for, duplicates included
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    unexpected: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.mismatched or self.unexpected)


def compare(expected: Mapping[Hashable, tuple[int, Any]], written: Iterable[tuple[Hashable, int, Any]]) -> CheckResult:
    """Items by key: expected key -> (records it stands for, content), written (key, records, content)."""
    seen: Counter[Hashable] = Counter()
    lost = duplicated = mismatched = unexpected = total = 0
    for key, records, content in written:
        total += records
        seen[key] += 1
        if key not in expected:
            unexpected += 1
        elif seen[key] > 1:
            duplicated += records
        elif (records, content) != expected[key]:
            mismatched += 1
            lost += max(0, expected[key][0] - records)
            duplicated += max(0, records - expected[key][0])
    lost += sum(records for key, (records, _) in expected.items() if key not in seen)
    return CheckResult(sum(r for r, _ in expected.values()), total, lost, duplicated, mismatched, unexpected)


def _micros(ts: float) -> int:
    return math.floor(ts * _MICROS)


def windows_of(ts: float, window_s: float, slide_s: float = 0.0) -> list[tuple[float, float]]:
    """The (start, end) event-time windows holding `ts`, aligned to the epoch as Spark aligns them."""
    size, slide, t = _micros(window_s), _micros(slide_s or window_s), _micros(ts)
    first = (t - size) // slide * slide + slide
    return [(s / _MICROS, (s + size) / _MICROS) for s in range(first, t + 1, slide) if s <= t < s + size]


def _closed(end: float, closed_before: float | None) -> bool:
    return closed_before is None or end <= closed_before


def check_ids(inputs: Iterable[Mapping[str, Any]], ids: Iterable[int]) -> CheckResult:
    """Each input id once among `ids`."""
    expected = {int(r["id"]): (1, None) for r in inputs}
    return compare(expected, ((int(i), 1, None) for i in ids))


def check_window_agg(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]], window_s: float,
                     slide_s: float = 0.0, closed_before: float | None = None) -> CheckResult:
    cells: dict[tuple[float, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in inputs:
        for start, end in windows_of(float(r["ts"]), window_s, slide_s):
            if _closed(end, closed_before):
                cell = cells[(start, r["key"])]
                cell[0] += 1
                cell[1] += int(r["id"])
    expected = {key: (count, id_sum) for key, (count, id_sum) in cells.items()}
    return compare(expected, (((float(r["window_start"]), r["key"]), int(r["count"]), int(r["id_sum"]))
                              for r in rows if _closed(float(r["window_end"]), closed_before)))


def check_join(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]], window_s: float) -> CheckResult:
    orders: dict[int, float] = {}
    payments: dict[int, float] = {}
    for r in inputs:
        (orders if r["side"] == "order" else payments)[int(r["order"])] = float(r["ts"])
    expected = {o: (2, None) for o, t in orders.items() if o in payments and t <= payments[o] <= t + window_s}
    return compare(expected, ((int(r["order"]), 2, None) for r in rows))


def _bids(inputs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in inputs if r["type"] == "bid"]


def check_q1(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]]) -> CheckResult:
    expected = {int(r["id"]): (1, round(r["bid"]["price"] * EUR_PER_USD, 3)) for r in _bids(inputs)}
    return compare(expected, ((int(r["id"]), 1, round(float(r["price_eur"]), 3)) for r in rows))


def check_q2(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]]) -> CheckResult:
    expected = {int(r["id"]): (1, None) for r in _bids(inputs) if r["bid"]["auction"] % Q2_AUCTION_SKIP == 0}
    return compare(expected, ((int(r["id"]), 1, None) for r in rows))


def check_q5(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]], window_s: float,
             slide_s: float, closed_before: float | None = None) -> CheckResult:
    cells: Counter[tuple[float, float, int]] = Counter()
    for r in _bids(inputs):
        for start, end in windows_of(float(r["ts"]), window_s, slide_s):
            if _closed(end, closed_before):
                cells[(start, end, int(r["bid"]["auction"]))] += 1
    reference = hot_items({"window_start": s, "window_end": e, "auction": a, "count": c}
                          for (s, e, a), c in cells.items())
    expected = {row["window_start"]: (row["bids"], (row["auction"], row["count"])) for row in reference}
    return compare(expected, ((float(r["window_start"]), int(r["bids"]), (int(r["auction"]), int(r["count"])))
                              for r in rows if _closed(float(r["window_end"]), closed_before)))


def check_q8(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]], window_s: float,
             closed_before: float | None = None) -> CheckResult:
    born: dict[int, float] = {}
    auctions: list[tuple[int, int, float]] = []
    for r in inputs:
        if r["type"] == "person":
            born[int(r["person"]["id"])] = windows_of(float(r["ts"]), window_s)[0][0]
        elif r["type"] == "auction":
            auctions.append((int(r["auction"]["id"]), int(r["auction"]["seller"]), float(r["ts"])))
    expected = {}
    for auction, seller, ts in auctions:
        start, end = windows_of(ts, window_s)[0]
        if born.get(seller) == start and _closed(end, closed_before):
            expected[(seller, auction)] = (1, start)
    return compare(expected, (((int(r["person"]), int(r["auction"])), 1, float(r["window_start"]))
                              for r in rows if _closed(float(r["window_end"]), closed_before)))


Session = tuple[Hashable, float, float, int, int]


def sessions(events: Iterable[tuple[Hashable, float, int]], gap_s: float) -> list[Session]:
    """Session windows of (key, ts, id) events: (key, start, end, count, id_sum), a session ending `gap_s`
    after its last event and taking every event before that end."""
    by_key: dict[Hashable, list[tuple[float, int]]] = defaultdict(list)
    for key, ts, ident in events:
        by_key[key].append((ts, ident))
    out = []
    for key, items in by_key.items():
        items.sort()
        start, end, count, id_sum = items[0][0], items[0][0] + gap_s, 0, 0
        for ts, ident in items:
            if ts >= end:
                out.append((key, start, end, count, id_sum))
                start, count, id_sum = ts, 0, 0
            end = max(end, ts + gap_s)
            count, id_sum = count + 1, id_sum + ident
        out.append((key, start, end, count, id_sum))
    return out


def check_q11(inputs: Iterable[Mapping[str, Any]], rows: Iterable[Mapping[str, Any]], gap_s: float,
              closed_before: float | None = None) -> CheckResult:
    """Sessions keyed by bidder and start in whole microseconds, as Spark holds an event time: its
    `timestamp_seconds` truncates the input's seconds to microseconds and the output casts them back. (Keyed
    by the start rounded to milliseconds instead, about 1 start in 2,700 rounded apart on the two sides:
    a session counted lost and unexpected with every record written.)"""
    found = sessions(((int(r["bid"]["bidder"]), float(r["ts"]), int(r["id"])) for r in _bids(inputs)), gap_s)
    expected = {(bidder, _micros(start)): (count, id_sum) for bidder, start, end, count, id_sum in found
                if _closed(end, closed_before)}
    return compare(expected, (((int(r["bidder"]), round(float(r["session_start"]) * _MICROS)), int(r["count"]),
                               int(r["id_sum"])) for r in rows if _closed(float(r["session_end"]), closed_before)))


Checker = Callable[[list[Mapping[str, Any]], list[Mapping[str, Any]], WorkloadOptions, "float | None"], CheckResult]

CHECKERS: dict[str, Checker] = {
    "enrich": lambda i, o, _opts, _c: check_ids(i, (n for record in o for n in record["ids"])),
    "window-agg": lambda i, o, opts, c: check_window_agg(i, output_rows(o), opts.window_s, opts.slide_s, c),
    "dedup": lambda i, o, _opts, _c: check_ids(i, (r["id"] for r in output_rows(o))),
    "join": lambda i, o, opts, _c: check_join(i, output_rows(o), opts.window_s),
    "nexmark-q1": lambda i, o, _opts, _c: check_q1(i, output_rows(o)),
    "nexmark-q2": lambda i, o, _opts, _c: check_q2(i, output_rows(o)),
    "nexmark-q5": lambda i, o, opts, c: check_q5(i, output_rows(o), opts.window_s, opts.slide_s, c),
    "nexmark-q8": lambda i, o, opts, c: check_q8(i, output_rows(o), opts.window_s, c),
    "nexmark-q11": lambda i, o, opts, c: check_q11(i, output_rows(o), opts.gap_s, c),
}
DEFAULTS: dict[str, Mapping[str, str]] = {"nexmark-q5": Q5_DEFAULTS}


def check(name: str, inputs: Iterable[Mapping[str, Any]], outputs: Iterable[Mapping[str, Any]],
          options: Mapping[str, str] | None = None, closed_before: float | None = None) -> CheckResult:
    """Workload `name`'s output records against its input records, under the job's options (see the module doc)."""
    if name not in CHECKERS:
        raise KeyError(f"no checker for workload {name!r}; known: {', '.join(sorted(CHECKERS))}")
    opts = WorkloadOptions.parse({**DEFAULTS.get(name, {}), **(options or {})}, "in", "out")
    return CHECKERS[name](list(inputs), list(outputs), opts, closed_before)

"""The monitor's open window of one job, typed: what it folded so far and the offsets it applied.

Every value here is immutable: `monitor.windows.add_report` returns a new state and never changes
the one it was given. Mappings are fresh dicts per value, never mutated after construction.

The stored form (the knowledge base keeps it as JSON between batches, and another monitor worker
may read it after a rebalance) is `WindowState.to_dict()`; `WindowState.from_dict` reads it and
the older forms still found in stores: windows saved before duplicate detection (no "seen"),
workers folded before report spans were kept (no "spans") and before state was kept (no "state").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Self

# A report's identity in its window: (worker id, repr of its end timestamp). repr is the shortest
# exact form of a float, so the key survives the stored form's JSON.
SeenKey = tuple[str, str]


class _Built:
    """`built`, the fast constructor of the frozen dataclasses below."""

    @classmethod
    def built(cls, fields: dict[str, Any]) -> Self:
        """An instance whose attributes are `fields`, every field by name (no defaults, no checks);
        it keeps the dict, which the caller must not use again. The monitor builds several values
        per report: this skips the frozen `__init__`'s attribute-by-attribute assignment and a
        keyword call's argument handling, which together cost more than the report's arithmetic."""
        value = object.__new__(cls)
        object.__setattr__(value, "__dict__", fields)
        return value



@dataclass(frozen=True)
class OperatorAggregate(_Built):
    """One operator's sums over a worker's reports in the window; `upstream` and `parallelism`
    are the last report's. `arrivals` sums arrival rate x interval, None until a report gives a rate."""

    records_in: int
    records_out: int
    busy: float
    arrivals: float | None
    upstream: tuple[str, ...]
    parallelism: int

    def to_dict(self) -> dict[str, Any]:
        return {"records_in": self.records_in, "records_out": self.records_out, "busy": self.busy,
                "arrivals": self.arrivals, "upstream": list(self.upstream), "parallelism": self.parallelism}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OperatorAggregate:
        arrivals = data["arrivals"]
        return cls(records_in=int(data["records_in"]), records_out=int(data["records_out"]), busy=float(data["busy"]),
                   arrivals=None if arrivals is None else float(arrivals), upstream=tuple(data["upstream"]),
                   parallelism=int(data["parallelism"]))


@dataclass(frozen=True)
class SourceAggregate(_Built):
    """A worker's source over the window: arrivals (rate x interval) over `observed` seconds, the
    backlog at its first and last report (at `first_at`, `last_at`), the last partition count."""

    arrivals: float
    observed: float
    backlog_first: int
    first_at: float
    backlog_last: int
    last_at: float
    partitions: int
    splittable: bool

    def to_dict(self) -> dict[str, Any]:
        return {"arrivals": self.arrivals, "observed": self.observed, "backlog_first": self.backlog_first,
                "first_at": self.first_at, "splittable": self.splittable, "backlog_last": self.backlog_last,
                "last_at": self.last_at, "partitions": self.partitions}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceAggregate:
        return cls(arrivals=float(data["arrivals"]), observed=float(data["observed"]),
                   backlog_first=int(data["backlog_first"]), first_at=float(data["first_at"]),
                   backlog_last=int(data["backlog_last"]), last_at=float(data["last_at"]),
                   partitions=int(data["partitions"]), splittable=bool(data["splittable"]))


# A stateful operator as a worker's state keeps it: (name, rows, memory bytes, state partitions).
StateEntry = tuple[str, int, int, int | None]


@dataclass(frozen=True)
class StateAggregate(_Built):
    """A worker's query state in the window: of its latest report (by end time, `at`) that carried
    state or an event-time lag, the stateful operators and the lags; commit time summed over all
    its reports in the window."""

    at: float
    operators: tuple[StateEntry, ...]
    commit_time: float
    watermark_lag: float | None
    output_lag: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "operators": [list(op) for op in self.operators], "commit_time": self.commit_time,
                "watermark_lag": self.watermark_lag, "output_lag": self.output_lag}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StateAggregate:
        watermark, output = data.get("watermark_lag"), data.get("output_lag")
        return cls(at=float(data["at"]),
                   operators=tuple((str(name), int(rows), int(memory), None if parts is None else int(parts))
                                   for name, rows, memory, parts in data["operators"]),
                   commit_time=float(data["commit_time"]),
                   watermark_lag=None if watermark is None else float(watermark),
                   output_lag=None if output is None else float(output))


@dataclass(frozen=True)
class WorkerAggregate(_Built):
    """One worker's reports in the window, summed.

    `first_begin`/`last_end` bound its reported intervals; `spans` does so per parallelism it
    reported (empty for a worker folded before spans were kept). `batches` and `batch_time` are None
    until a report carries micro-batches, `shuffle_partitions` and `source` until one reports them,
    `state` until one carries stateful operators or an event-time lag."""

    records_in: int
    records_out: int
    busy: float
    observed: float
    first_begin: float
    last_end: float
    parallelism_first: int
    parallelism_last: int
    parallelism_changed: bool
    cpu_weighted: float
    cpu_time: float
    operators: Mapping[str, OperatorAggregate]
    spans: Mapping[int, tuple[float, float]]
    batches: int | None = None
    batch_time: float | None = None
    shuffle_partitions: int | None = None
    source: SourceAggregate | None = None
    state: StateAggregate | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "records_in": self.records_in, "records_out": self.records_out, "busy": self.busy,
            "observed": self.observed, "first_begin": self.first_begin, "last_end": self.last_end,
            "parallelism_first": self.parallelism_first, "cpu_weighted": self.cpu_weighted,
            "cpu_time": self.cpu_time, "operators": {k: op.to_dict() for k, op in self.operators.items()},
        }
        if self.batches is not None:
            data["batches"], data["batch_time"] = self.batches, self.batch_time
        data["spans"] = {str(p): [begin, end] for p, (begin, end) in self.spans.items()}
        data["parallelism_last"] = self.parallelism_last
        if self.shuffle_partitions is not None:
            data["shuffle_partitions"] = self.shuffle_partitions
        data["parallelism_changed"] = self.parallelism_changed
        if self.source is not None:
            data["source"] = self.source.to_dict()
        if self.state is not None:
            data["state"] = self.state.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerAggregate:
        batches, shuffle, source = data.get("batches"), data.get("shuffle_partitions"), data.get("source")
        state = data.get("state")
        return cls(
            records_in=int(data["records_in"]), records_out=int(data["records_out"]), busy=float(data["busy"]),
            observed=float(data["observed"]), first_begin=float(data["first_begin"]),
            last_end=float(data["last_end"]), parallelism_first=int(data["parallelism_first"]),
            parallelism_last=int(data["parallelism_last"]), parallelism_changed=bool(data["parallelism_changed"]),
            cpu_weighted=float(data["cpu_weighted"]), cpu_time=float(data["cpu_time"]),
            operators={k: OperatorAggregate.from_dict(op) for k, op in data["operators"].items()},
            spans={int(p): (float(span[0]), float(span[1])) for p, span in data.get("spans", {}).items()},
            batches=None if batches is None else int(batches),
            batch_time=None if batches is None else float(data.get("batch_time") or 0.0),
            shuffle_partitions=None if shuffle is None else int(shuffle),
            source=None if source is None else SourceAggregate.from_dict(source),
            state=None if state is None else StateAggregate.from_dict(state),
        )


class SeenReports:
    """The reports a window remembers for duplicate detection, as an immutable set of `SeenKey`s.

    `adding` returns a new value in constant time, however many keys there are: values built one
    from another share one insertion-ordered dict, each seeing only its first `len` entries. Adding
    to a value that is not the newest of its line copies its own entries first, so no value ever
    changes what it holds."""

    __slots__ = ("_index", "_len")
    _index: dict[SeenKey, int]
    _len: int

    def __init__(self, keys: Iterable[SeenKey] = ()) -> None:
        index: dict[SeenKey, int] = {}
        for key in keys:
            index.setdefault(key, len(index))
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_len", len(index))

    @classmethod
    def _of(cls, index: dict[SeenKey, int], length: int) -> SeenReports:
        seen = object.__new__(cls)
        object.__setattr__(seen, "_index", index)
        object.__setattr__(seen, "_len", length)
        return seen

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __contains__(self, key: object) -> bool:
        position = self._index.get(key)  # type: ignore[call-overload]
        return position is not None and position < self._len

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[SeenKey]:
        return islice(self._index, self._len)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeenReports):
            return NotImplemented
        return self._len == other._len and all(key in other for key in self)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SeenReports({list(self)!r})"

    def adding(self, key: SeenKey) -> SeenReports:
        """These keys and `key`."""
        index = self._index
        position = index.get(key)
        if position is not None and position < self._len:
            return self
        if len(index) != self._len:  # another value already grew this dict: branch off
            index = dict(islice(index.items(), self._len))
        index[key] = self._len
        return SeenReports._of(index, self._len + 1)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """The stored form: {worker id: {timestamp key: 1}}."""
        by_worker: dict[str, dict[str, int]] = {}
        for worker, stamp in self:
            by_worker.setdefault(worker, {})[stamp] = 1
        return by_worker

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> SeenReports:
        return cls((worker, stamp) for worker, stamps in data.items() for stamp in stamps)



@dataclass(frozen=True)
class WindowState(_Built):
    """A job's open window [start, start + interval): the reports folded (`reports`), per worker
    (`workers`, in order of first report), and the last offset applied per partition (`offsets`,
    carried from window to window). `seen` holds the first reports' keys, up to the monitor's cap."""

    start: float
    reports: int = 0
    workers: Mapping[str, WorkerAggregate] = field(default_factory=dict)
    offsets: Mapping[int, int] = field(default_factory=dict)
    seen: SeenReports = field(default_factory=SeenReports)

    def to_dict(self) -> dict[str, Any]:
        """The stored form (JSON-serializable), the same layout as every earlier version wrote."""
        return {"start": self.start, "reports": self.reports,
                "workers": {worker_id: w.to_dict() for worker_id, w in self.workers.items()},
                "offsets": {str(p): offset for p, offset in self.offsets.items()},
                "seen": self.seen.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowState:
        """A state from its stored form, this version's or an older one (see the module docstring)."""
        return cls(start=float(data["start"]), reports=int(data["reports"]),
                   workers={worker_id: WorkerAggregate.from_dict(w) for worker_id, w in data["workers"].items()},
                   offsets={int(p): int(offset) for p, offset in data["offsets"].items()},
                   seen=SeenReports.from_dict(data.get("seen", {})))

"""What a stage's agent is to the runtime that runs it: topics in, a publish function out, timers.

Each stage (monitor, analyze, plan, execute) has an agent class that implements `Stage`. The Faust
runtime (`agent.app`) subscribes every `Subscription` to its topic, retries a handler while the
knowledge base is unreachable, runs the timers, and publishes through `Publish`. A stage never
sees Faust, so its agent can be driven by anything that delivers records (the tests drive them
with the in-memory knowledge base).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Incoming:
    """One record from a topic, as the stage sees it."""

    value: bytes | None
    key: bytes | None = None
    topic: str = ""
    partition: int | None = None
    offset: int | None = None


Publish = Callable[[str, str, bytes], Awaitable[None]]
"""`publish(topic, key, value)`: `topic` names a field of `contracts.settings.Topics`, e.g. "decisions".

It returns once the broker has acknowledged the record, so a stage may then record in knowledge that
it was sent (a window closed, an event emitted): a crash after that point never loses the record."""


@dataclass(frozen=True)
class Subscription:
    """A stage reads `topic` (a field of `Topics`) with `handle`, in batches of up to `batch_max`
    records gathered within `batch_within_s`; `name` names the runtime's consumer of it."""

    name: str
    topic: str
    handle: Callable[[list[Incoming]], Awaitable[None]]
    batch_max: int = 1
    batch_within_s: float = 0.0


# How many records a per-job stage (analyze, plan) takes at once, and how long it waits to fill them.
JOB_BATCH_MAX = 100
JOB_BATCH_WITHIN_S = 0.01


async def per_key(records: list[Incoming], handle: Callable[[Incoming], Awaitable[None]]) -> None:
    """Handle each key's records in order and different keys' records concurrently.

    A stage's work per record is mostly waiting (knowledge round trips, a forecast step in a thread);
    handled one after another, the records of a worker's many jobs would queue behind each other's
    waits (see docs/results.md, "Measurements moved from docstrings"). One job's
    records stay in order. Every record's handler finishes before the first error is raised, so a
    retried batch never overlaps work still under way."""
    groups: dict[bytes | None, list[Incoming]] = {}
    for record in records:
        groups.setdefault(record.key, []).append(record)

    async def run(group: list[Incoming]) -> None:
        for record in group:
            await handle(record)

    if len(groups) == 1:
        await run(records)
        return
    outcomes = await asyncio.gather(*(run(group) for group in groups.values()), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def publish_per_key(publish: Publish, topic: str, messages: list[tuple[str, bytes]]) -> None:
    """Publish `(key, value)` messages as `per_key` handles records: one key's in order, different
    keys' concurrently. Each publish waits for the broker's acknowledgement; a monitor closing the
    windows of a thousand jobs at once would otherwise wait for a thousand round trips in a row."""
    records = [Incoming(value=value, key=key.encode()) for key, value in messages]
    await per_key(records, lambda record: publish(topic, (record.key or b"").decode(), record.value or b""))


@dataclass(frozen=True)
class Timer:
    """Work the runtime runs every `interval_s` seconds; a failure is logged and retried next time."""

    name: str
    interval_s: float
    run: Callable[[], Awaitable[None]]


class Stage(Protocol):
    name: str
    publishes: tuple[str, ...]

    def subscriptions(self) -> list[Subscription]: ...

    def timers(self) -> list[Timer]: ...

    async def partitions_revoked(self) -> None:
        """Another worker may own some of this worker's keys now: forget what was cached."""

    def close(self) -> None:
        """The worker stops: release what the stage holds (process pools, clients)."""

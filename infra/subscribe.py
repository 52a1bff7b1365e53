"""Subscribe to decisions and scaling events, each once. Needs confluent-kafka, not Faust.

The autoscaler publishes at least once: when a plan worker dies after committing a decision and
before its Kafka offset is committed, the worker that gets the window again publishes the committed
decision again, byte for byte (same `decision_id`); execute publishes an event again after a crash
with the same `event_id` (only its `timestamp` may differ). Dropping a repeat loses nothing.

`Once` drops the repeats: it remembers the last `memory` ids of each kind (decisions by
`decision_id`, events by `event_id`) and passes a message only the first time its id is seen. A repeat
comes when another worker takes over the dead one's partitions (after the consumer session timeout) or
the worker is started again; the default memory, 65,536 ids per kind, is 10.9 minutes of decisions of
1,000 jobs at a 10-s window. The memory lives as long as the subscriber: one that restarts and reads
again from an earlier point sees again what it saw before; a consumer that must survive its own
restarts keeps the ids it handled (or makes what it does idempotent by them).

    from infra.subscribe import Subscriber
    with Subscriber(settings) as subscriber:
        for message in subscriber.messages():   # ScalingDecision or ScalingEvent, each once
            ...
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from types import TracebackType

from confluent_kafka import Consumer

from contracts.decisions import ScalingDecision, ScalingEvent
from contracts.settings import Settings
from infra.kafka import group_consumer_config

DEFAULT_MEMORY = 65_536

Message = ScalingDecision | ScalingEvent


class SeenIds:
    """The last `memory` distinct ids seen, oldest forgotten first."""

    def __init__(self, memory: int = DEFAULT_MEMORY):
        if memory < 1:
            raise ValueError(f"memory must be >= 1, got {memory}")
        self.memory = memory
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first(self, key: str) -> bool:
        """True the first time `key` is seen among the last `memory` distinct ids; a repeat refreshes it."""
        if key in self._ids:
            self._ids.move_to_end(key)
            return False
        self._ids[key] = None
        if len(self._ids) > self.memory:
            self._ids.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._ids)


class Once:
    """Decisions once by `decision_id`, scaling events once by `event_id` (two memories, one per kind)."""

    def __init__(self, memory: int = DEFAULT_MEMORY):
        self.decisions = SeenIds(memory)
        self.events = SeenIds(memory)
        self.repeats = 0

    def first(self, message: Message) -> bool:
        """True for the first copy of a message, False for a repeat."""
        if isinstance(message, ScalingDecision):
            new = self.decisions.first(message.decision_id)
        else:
            new = self.events.first(message.event_id)
        self.repeats += not new
        return new


class Subscriber:
    """The decisions and scaling-events topics, parsed, each message once (`Once`), in a consumer
    group of its own that commits nothing: from the newest message, or with `from_beginning` from the
    oldest the topics retain."""

    def __init__(self, settings: Settings, *, from_beginning: bool = False, memory: int = DEFAULT_MEMORY):
        self.settings = settings
        self.once = Once(memory)
        self.consumer = Consumer(group_consumer_config(
            settings, f"autoscaler-watch-{uuid.uuid4().hex[:8]}", "earliest" if from_beginning else "latest"))
        self.consumer.subscribe([settings.topics.decisions, settings.topics.scaling_events])

    def poll(self, timeout_s: float) -> Message | None:
        """The next message not seen before, or None when none came within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.consumer.poll(max(0.0, deadline - time.monotonic()))
            if record is None:
                return None
            if record.error() is None and record.value():
                message: Message = (ScalingDecision if record.topic() == self.settings.topics.decisions
                                    else ScalingEvent).model_validate_json(record.value())
                if self.once.first(message):
                    return message
            if time.monotonic() >= deadline:
                return None

    def messages(self, seconds: float = 0.0) -> Iterator[Message]:
        """Messages as they arrive, each once, for `seconds` (0: until the caller stops)."""
        deadline = time.monotonic() + seconds if seconds else float("inf")
        while time.monotonic() < deadline:
            message = self.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if message is not None:
                yield message

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

"""The Faust runtime: one factory, any subset of the four stages in one worker.

It wires each stage's agent (`contracts.stage.Stage`) to Faust: a Faust agent per subscription, a
Faust timer per timer, and `Runtime.publish` for what the stages send. The stages never import this."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import faust
from aiohttp import web as aiohttp_web
from aiokafka.errors import KafkaError
from faust.transport.drivers import aiokafka as faust_aiokafka
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from analyze.agent import AnalyzeAgent
from contracts.metrics import REGISTRY
from contracts.settings import Settings
from contracts.stage import Incoming, Publish, Stage, Subscription, Timer
from execute.agent import ExecuteAgent
from infra.kafka import TopicKeeper
from infra.resilience import until_done
from infra.security import faust_credentials, redact
from infra.webauth import UNAUTHORIZED, bearer_matches, web_token
from knowledge import Knowledge, RedisKnowledge
from monitor.agent import MonitorAgent
from plan.agent import PlanAgent

STAGE_AGENTS: dict[str, Callable[[Settings, Knowledge, Publish], Stage]] = {
    "monitor": MonitorAgent, "analyze": AnalyzeAgent, "plan": PlanAgent, "execute": ExecuteAgent,
}
STAGES = tuple(STAGE_AGENTS)
log = logging.getLogger("autoscaler")

# Faust hard-codes fetch_max_wait_ms=1500 for its worker consumer. Apache Kafka answers a waiting
# fetch as soon as data arrives, so there the value only matters when idle. The embedded tansu
# broker sees data that arrives during a wait only when it re-checks, after half the wait, so each
# agent hop can cost half the wait; a short wait bounds that, at the price of more empty fetches
# while idle (see docs/results.md, "Measurements moved from docstrings"). The value is the setting
# `AUTOSCALER_BROKER_FETCH_MAX_WAIT_MS`.

# Records per poll. Uncapped, Faust delivers everything aiokafka prefetched (~1 MiB per partition)
# before it polls again; behind a backlog on a busy machine that took over max_poll_interval, the
# consumer left its group and, with Faust's flow stopped, never rejoined (a stuck worker).
MAX_POLL_RECORDS = 500

# How often a worker checks that its topics still exist (a few ms against a local broker).
TOPIC_CHECK_S = 2.0


def _transport_with_fetch_wait(fetch_max_wait_ms: int, readiness: Readiness) -> type[faust_aiokafka.Transport]:
    """Faust's aiokafka transport, but its worker consumer uses `fetch_max_wait_ms` and tells
    `readiness` of each fetch."""

    class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # aiokafka copies this into its fetcher only when the consumer starts, so setting it
            # here (created, not started) is equivalent to passing it to the constructor.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class WorkerConsumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

        async def perform_seek(self) -> None:
            await super().perform_seek()
            await rewind_lost_partitions(self)

        async def _getmany(self, active_partitions: Any, timeout: float) -> Any:
            began = time.monotonic()
            records = await super()._getmany(active_partitions, timeout)
            readiness.fetched(began)
            return records

    class Transport(faust_aiokafka.Transport):
        Consumer = WorkerConsumer

    return Transport


async def rewind_lost_partitions(consumer: Any) -> None:
    """Read from the start every partition whose log now ends before the consumer's position.

    A broker that lost its data (the embedded broker keeps nothing on disk) starts its topics again
    at offset 0, while the worker still holds its old offsets and commits them to the new broker when
    it rejoins; it would then skip every new record below them, losing reports. Uses Faust's
    consumer bookkeeping (there is no public API for it)."""
    positions = {
        tp: position
        for tp in consumer.assignment()
        if (position := consumer._read_offset.get(tp) or consumer._committed_offset.get(tp))
    }
    if not positions:
        return
    ends = await consumer.highwaters(*positions)
    for tp, position in positions.items():
        end = ends.get(tp)
        if end is None or position <= end:
            continue
        log.warning("%s[%d] ends at offset %d, before the position %d: the broker lost it; reading it from "
                    "the start", tp.topic, tp.partition, end, position)
        for bookkeeping in (consumer._acked, consumer._acked_index, consumer._gap):
            bookkeeping.pop(tp, None)
        consumer._committed_offset[tp] = None
        await consumer.seek(tp, 0)


@dataclass
class Readiness:
    """Whether a worker takes part in its consumer group: it has had an assignment and, if that
    assignment holds partitions, has fetched from them once since (their positions are then known).

    An empty assignment is complete at once: a group may have more workers than partitions. Once
    ready, a worker stays ready through later rebalances; only Redis turns /ready back to 503."""

    assigned_at: float | None = None
    partitions: int = 0
    fetched_at: float | None = None

    def assigned(self, partitions: int, at: float | None = None) -> None:
        self.partitions = partitions
        if self.assigned_at is None:
            self.assigned_at = time.monotonic() if at is None else at

    def fetched(self, began: float) -> None:
        """A fetch that began at `began` (monotonic) returned, with records or without."""
        if self.fetched_at is None and self.assigned_at is not None and began >= self.assigned_at:
            self.fetched_at = time.monotonic()

    def waiting_for(self) -> str | None:
        """What the worker still waits for before it is ready; None once it is."""
        if self.assigned_at is None:
            return "partition assignment"
        if self.fetched_at is None and self.partitions:
            return "the first fetch"
        return None


@dataclass
class Runtime:
    """One worker: the Faust app, its settings and knowledge, the stages it runs and their topics."""

    app: faust.App
    settings: Settings
    knowledge: Knowledge
    readiness: Readiness = field(default_factory=Readiness)
    stages: list[Stage] = field(default_factory=list)
    topics: dict[str, faust.TopicT] = field(default_factory=dict)

    def topic(self, name: str) -> faust.TopicT:
        if name not in self.topics:
            self.topics[name] = self.app.topic(
                getattr(self.settings.topics, name),
                key_serializer="raw",
                value_serializer="raw",
                partitions=self.settings.topic_partitions,
            )
        return self.topics[name]

    async def publish(self, name: str, key: str, value: bytes) -> None:
        """Send and wait for the broker's acknowledgement (`contracts.stage.Publish`).

        Faust's `send` returns once the record is in the producer's buffer; a worker killed then
        (SIGKILL, no flush) lost it although the stage had already recorded it as sent."""
        topic = self.topic(name)

        async def send() -> None:
            delivered = await topic.send(key=key.encode(), value=value)
            await delivered

        # A broker that is away, or back but empty (its topics recreated, the producer's metadata
        # stale), fails the send: send the same record again until the broker takes it. Stages drop
        # a record they already have (by window end, decision or event id), so a repeat is harmless.
        await until_done(send, f"publishing to {name}", transient=(KafkaError,), waits_for="the broker",
                         settings=self.settings)

    def run_stage(self, stage: Stage) -> None:
        """Subscribe the stage's handlers (retried while knowledge is away) and start its timers."""
        self.stages.append(stage)
        for name in stage.publishes:
            self.topic(name)
        for subscription in stage.subscriptions():
            self._subscribe(stage.name, subscription)
        for timer in stage.timers():
            self._every(timer)

    def _subscribe(self, stage: str, subscription: Subscription) -> None:
        topic = self.topic(subscription.topic)
        handle = subscription.handle

        async def consume(stream: Any) -> None:
            if subscription.batch_max > 1:
                async for events in stream.take_events(subscription.batch_max, within=subscription.batch_within_s):
                    records = [_incoming(event) for event in events]
                    await until_done(lambda records=records: handle(records), stage)
            else:
                async for value in stream:
                    record = _incoming(stream.current_event, value)
                    await until_done(lambda record=record: handle([record]), stage)

        self.app.agent(topic, name=subscription.name)(consume)

    def _every(self, timer: Timer) -> None:
        async def tick() -> None:
            try:
                await timer.run()
            except Exception:
                log.exception("%s failed; will retry", timer.name)

        tick.__name__ = tick.__qualname__ = timer.name.replace("-", "_")
        self.app.timer(timer.interval_s)(tick)


def _incoming(event: Any, value: bytes | None = None) -> Incoming:
    message = event.message if event is not None else None
    if message is None:
        return Incoming(value=value)
    return Incoming(value=event.value if value is None else value, key=message.key, topic=message.topic,
                    partition=message.partition, offset=message.offset)


def app_id_for(settings: Settings, stages: Iterable[str]) -> str:
    """All four stages share one consumer group; a single-stage worker gets its own group."""
    chosen = sorted(set(stages))
    if chosen == sorted(STAGES):
        return settings.app_id
    return f"{settings.app_id}-{'-'.join(chosen)}"


def create_app(settings: Settings, stages: Iterable[str] = STAGES) -> tuple[faust.App, Runtime]:
    chosen = list(dict.fromkeys(stages))
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    app = faust.App(
        app_id_for(settings, chosen),
        broker=f"kafka://{settings.kafka_bootstrap}",
        broker_credentials=faust_credentials(settings),  # None: PLAINTEXT, as before
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.topic_partitions,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.broker_session_timeout_s,
        broker_heartbeat_interval=settings.broker_heartbeat_interval_s,
        broker_max_poll_interval=settings.broker_max_poll_interval_s,
        broker_max_poll_records=MAX_POLL_RECORDS,
        broker_rebalance_timeout=settings.broker_max_poll_interval_s,
        broker_request_timeout=max(40.0, settings.broker_session_timeout_s + 5),
        producer_linger=0.0,
        web_port=settings.web_port,
        web_bind=settings.web_host,  # the address it listens on (Faust's web_host only names it in URLs)
        web_host=settings.web_host,
        web_in_thread=False,
        topic_disable_leader=True,
        table_cleanup_interval=3600.0,
    )
    readiness = Readiness()
    # Replaces the transport Faust would build from the broker URL (same class, shorter fetch wait).
    app.transport = _transport_with_fetch_wait(settings.broker_fetch_max_wait_ms, readiness)(
        app.conf.broker_consumer, app)
    runtime = Runtime(app=app, settings=settings, knowledge=RedisKnowledge(settings), readiness=readiness)
    token = web_token(settings)
    if token:
        app.web.web_app.middlewares.append(_require_token(token))

    @app.page("/metrics")
    async def metrics_page(self: object, request: object) -> object:
        # In a thread: at thousands of jobs the exposition takes a fifth of a second, which would hold
        # every stage's windows for as long (the registry takes its own locks).
        body = await asyncio.to_thread(generate_latest, REGISTRY)
        return app.web.bytes(body, content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/ready")
    async def ready_page(self: object, request: object) -> object:
        """200 once Redis answers and the worker has its partitions and has fetched (`Readiness`)."""
        try:
            await runtime.knowledge.ping()
        except Exception as exc:  # any Redis failure means degraded
            # Redacted: the page may be unauthenticated and an error may quote a URL with its password.
            error = redact(str(exc), settings)
            return app.web.json({"ready": False, "status": "degraded", "error": error}, status=503)
        waiting = readiness.waiting_for()
        if waiting is not None:
            return app.web.json({"ready": False, "status": "starting", "waiting_for": waiting, "stages": chosen},
                                status=503)
        return app.web.json({"ready": True, "status": "ok", "stages": chosen, "partitions": readiness.partitions})

    keeper = TopicKeeper(settings)

    @app.timer(TOPIC_CHECK_S)
    async def keep_topics() -> None:
        try:
            created = await asyncio.to_thread(keeper.check)
        except Exception as exc:  # the broker is away: the clients reconnect by themselves
            log.debug("topic check failed: %s", redact(str(exc), settings))
            return
        if created:
            log.warning("recreated missing topics (the broker lost them): %s", ", ".join(sorted(created)))

    @app.on_partitions_assigned.connect
    async def note_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        readiness.assigned(len(assigned))

    @app.on_partitions_revoked.connect
    async def forget_cached(sender: Any, revoked: Any, **kwargs: Any) -> None:
        for stage in runtime.stages:
            await stage.partitions_revoked()

    @app.on_before_shutdown.connect
    async def close_stages(sender: Any, **kwargs: Any) -> None:
        for stage in runtime.stages:
            stage.close()

    for name in chosen:
        runtime.run_stage(STAGE_AGENTS[name](settings, runtime.knowledge, runtime.publish))
    return app, runtime


def _require_token(token: str) -> Any:
    """aiohttp middleware: every page of the worker (ours and Faust's own) wants the bearer token."""

    @aiohttp_web.middleware
    async def check(request: aiohttp_web.Request, handler: Any) -> aiohttp_web.StreamResponse:
        if not bearer_matches(request.headers.get("Authorization"), token):
            return aiohttp_web.json_response({"error": UNAUTHORIZED}, status=401,
                                             headers={"WWW-Authenticate": "Bearer"})
        response: aiohttp_web.StreamResponse = await handler(request)
        return response

    return check

"""Bad input, live: a seeded mix of a few hundred messages on the metrics topic against the real
broker and Redis. Every message is accepted or dead-lettered with the reason known up-front, and the
agents keep running and deciding."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from contracts.dead_letters import DeadLetter
from contracts.decisions import ScalingDecision
from contracts.messages import MetricReport
from contracts.settings import Settings
from knowledge import RedisKnowledge
from stack.services import AgentWorker
from tests.conftest import wait_until
from tests.integration.kafka_helpers import Collector, producer, send
from tests.integration.test_agents import prometheus_samples, register

pytestmark = pytest.mark.integration

SEED = 1729
ACCEPTED = "accepted"


@dataclass
class Message:
    key: bytes | None
    value: bytes | None
    expected: str  # ACCEPTED or the dead-letter reason
    kind: str  # what the generator made, for failure messages


def report(job: str, ts: float, worker: str, records_in: int = 100) -> dict[str, Any]:
    return {"schema_version": 1, "job_id": job, "timestamp": ts, "interval_s": 1.0, "worker_id": worker,
            "parallelism": 2, "records_in": records_in, "records_out": records_in, "busy_time_s": 0.5,
            "source": {"arrival_rate": 120.0, "backlog": 10, "partitions": 4}}


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()  # allow_nan: NaN and Infinity go out as JSON's non-standard tokens


def random_bytes(rng: random.Random, size: int) -> bytes:
    """Bytes that are not JSON (a seeded draw that happens to parse, like b"7", is drawn again)."""
    while True:
        value = rng.randbytes(size)
        try:
            json.loads(value)
        except ValueError:
            return value


def mutate(rng: random.Random, good: dict[str, Any]) -> tuple[bytes, str, str]:
    """One mutation of a valid report, with the reason it must be dead-lettered for."""
    required = ["job_id", "timestamp", "interval_s", "parallelism", "records_in", "records_out", "busy_time_s"]
    numeric = ["timestamp", "interval_s", "parallelism", "records_in", "records_out", "busy_time_s"]
    bad = dict(good)
    op = rng.choice(["drop", "retype", "negative", "nan_inf", "huge", "unicode_key", "version", "truncate",
                     "bad_job_id", "cpu_range", "unknown_upstream"])
    if op == "drop":
        del bad[rng.choice(required)]
    elif op == "retype":
        field = rng.choice(required)
        # Values the contract refuses in lax mode too: no numeric strings or bools for numbers.
        bad[field] = rng.choice([None, [1], {"x": 1}] + (["many"] if field != "job_id" else [12345]))
    elif op == "negative":
        bad[rng.choice(numeric[1:])] = -rng.uniform(0.001, 1e6)
    elif op == "nan_inf":
        bad[rng.choice(["timestamp", "interval_s", "busy_time_s"])] = rng.choice([math.nan, math.inf, -math.inf])
    elif op == "huge":
        field, value = rng.choice([("records_in", 10**400), ("records_out", 10**16), ("busy_time_s", 1e308),
                                   ("parallelism", 10**9), ("interval_s", 1e6)])
        bad[field] = value
    elif op == "unicode_key":
        bad[rng.choice(["ключ", "☃", "é\u0301", "名前", "\u202e"])] = rng.random()
    elif op == "version":
        bad["schema_version"] = rng.choice([0, 2, 99, -1])
        return encode(bad), "unknown_schema_version", op
    elif op == "truncate":
        raw = encode(bad)
        return raw[: rng.randint(1, len(raw) - 1)], "malformed_json", op  # a proper prefix of an object
    elif op == "bad_job_id":
        bad["job_id"] = rng.choice(["has space", "", "-leading", "x" * 200, "slash/job"])
    elif op == "cpu_range":
        bad["cpu_utilization"] = rng.choice([1.5, -0.1])
    elif op == "unknown_upstream":
        bad["operators"] = [{"operator_id": "b", "upstream": ["a"], "parallelism": 1, "records_in": 1,
                             "records_out": 1, "busy_time_s": 0.1}]
    return encode(bad), "invalid_report", op


def bad_input_mix(job: str, other_job: str, start: float, limit: int, rng: random.Random) -> list[Message]:
    """The job's valid reports, 6 windows of 2 workers shuffled within each window, interleaved with
    duplicates and late reports (their reasons follow from the order, which one key keeps) and with
    noise whose reason does not depend on the order."""
    key = job.encode()
    stream: list[Message] = []
    earlier: list[dict[str, Any]] = []  # reports of windows already closed by the current one
    for k in range(6):
        block = [report(job, start + k * 10 + j, w, rng.randint(50, 150)) for j in range(1, 10) for w in ("w1", "w2")]
        rng.shuffle(block)  # out of order within the open window: accepted
        sent: list[dict[str, Any]] = []
        for r in block:
            stream.append(Message(key, encode(r), ACCEPTED, "valid"))
            sent.append(r)
            roll = rng.random()
            if roll < 0.12:  # a reporter's retry: same bytes, another offset
                stream.append(Message(key, encode(rng.choice(sent)), "duplicate_report", "exact duplicate"))
            elif roll < 0.18:  # same worker and interval end, other numbers: still one interval
                again = dict(rng.choice(sent))
                again["records_in"] += 1
                stream.append(Message(key, encode(again), "duplicate_report", "conflicting duplicate"))
            elif roll < 0.24 and k > 0:  # a new report for a closed window
                ts = start + rng.randrange(k) * 10 + rng.choice([0.25, 5.5, 9.75])
                stream.append(Message(key, encode(report(job, ts, "w3")), "late_report", "late"))
            elif roll < 0.28 and earlier:  # a duplicate of a closed window's report is late, not duplicate
                stream.append(Message(key, encode(rng.choice(earlier)), "late_report", "late duplicate"))
        earlier += sent

    good = report(job, start + 1, "w1")
    noise: list[Message] = []
    for _ in range(50):
        size = rng.choice([rng.randint(1, 64), rng.randint(64, 4096)])
        noise.append(Message(rng.choice([key, None, rng.randbytes(8)]), random_bytes(rng, size), "malformed_json",
                             "random bytes"))
    for i in range(12):
        pad = limit + rng.randint(1, 100_000)
        value = random_bytes(rng, pad) if i % 2 else encode(good | {"pad": "y" * pad})
        noise.append(Message(key, value, "oversize", "oversize"))
    for _ in range(70):
        value, reason, op = mutate(rng, good)
        noise.append(Message(key, value, reason, f"mutated: {op}"))
    for _ in range(10):
        future = report(job, time.time() + rng.uniform(3600, 10**6), "w1")
        noise.append(Message(key, encode(future), "from_the_future", "future"))
    for i in range(10):
        ghost = f"ghost-{uuid.uuid4().hex[:6]}-{i}"
        noise.append(Message(ghost.encode(), encode(report(ghost, start + 1, "w1")), "unknown_job", "unknown job"))
    for _ in range(8):
        noise.append(Message(rng.choice([b"someone-else", rng.randbytes(6)]), encode(good), "key_mismatch",
                             "key mismatch"))
    noise += [Message(key, None, "empty", "null value"), Message(key, b"", "empty", "empty value"),
              Message(None, None, "empty", "null value, no key"), Message(None, b"", "empty", "empty, no key")]
    for message in noise:
        stream.insert(rng.randint(0, len(stream)), message)

    # Another job: a report within the allowed clock skew is taken and opens its window, so the
    # job's on-time reports that follow are late.
    other = other_job.encode()
    stream += [
        Message(other, encode(report(other_job, time.time() + 60, "w1")), ACCEPTED, "future within skew"),
        Message(other, encode(report(other_job, start + 1, "w1")), "late_report", "behind a skewed report"),
        Message(other, encode(report(other_job, start + 2, "w1")), "late_report", "behind a skewed report"),
    ]
    return stream


def produce(settings: Settings, messages: list[Message]) -> dict[tuple[int, int], Message]:
    """Sends in order; returns each message by the (partition, offset) the broker gave it."""
    placed: dict[tuple[int, int], Message] = {}
    errors: list[str] = []
    p = producer(settings)
    for message in messages:
        def delivered(err: Any, msg: Any, message: Message = message) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                placed[(msg.partition(), msg.offset())] = message

        p.produce(settings.topics.metrics, key=message.key, value=message.value, on_delivery=delivered)
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors
    assert len(placed) == len(messages)
    return placed


def counters(settings: Settings) -> dict[str, int]:
    async def go() -> dict[str, int]:
        knowledge = RedisKnowledge(settings)
        try:
            return await knowledge.counters()
        finally:
            await knowledge.close()

    return asyncio.run(go())


def summed(port: int, metric: str, label: str) -> Counter[str]:
    totals: Counter[str] = Counter()
    for labels, value in prometheus_samples(port, metric):
        totals[labels.split(f'{label}="')[1].split('"')[0]] += int(value)
    return totals


def test_every_bad_message_is_accepted_or_dead_lettered_by_rule(settings: Settings, agents: AgentWorker) -> None:
    run = uuid.uuid4().hex[:6]
    job, other_job, after_job = f"badin-{run}", f"badin-skew-{run}", f"badin-after-{run}"
    for name in (job, other_job, after_job):
        register(settings, name)
    start = math.floor(time.time() / 10) * 10 - 3000
    messages = bad_input_mix(job, other_job, start, settings.max_message_bytes, random.Random(SEED))
    expected = Counter(m.expected for m in messages)
    assert 300 <= len(messages) <= 500 and all(expected[r] for r in (
        "malformed_json", "invalid_report", "unknown_schema_version", "oversize", "from_the_future", "unknown_job",
        "key_mismatch", "empty", "late_report", "duplicate_report"))
    n_rejected = len(messages) - expected[ACCEPTED]
    before = counters(settings)  # Redis counters are shared by the session's tests: compare deltas

    letters = Collector(settings, settings.topics.dead_letter)
    try:
        placed = produce(settings, messages)
        letters.until(DeadLetter.model_validate_json, lambda d: len(d) >= n_rejected, timeout=60)
        wait_until(lambda: summed(agents.web_port, "autoscaler_reports_accepted_total", "job").total()
                   >= expected[ACCEPTED], timeout=30, message="accepted reports")
        letters.poll(2.0)  # nothing more may come
    finally:
        letters.close()
    got = [DeadLetter.model_validate_json(value) for _, value, _ in letters.records]

    # Each dead letter is one sent message, with the reason expected for it, its detail and its bytes.
    lettered: set[tuple[int, int]] = set()
    for letter in got:
        assert letter.partition is not None and letter.offset is not None
        where = (letter.partition, letter.offset)
        message = placed[where]
        assert where not in lettered, f"dead-lettered twice: {message.kind}"
        lettered.add(where)
        assert letter.reason == message.expected, (message.kind, letter.reason, letter.detail[:200])
        assert letter.detail and letter.source_topic == settings.topics.metrics
        raw = message.value or b""
        assert base64.b64decode(letter.payload_base64) == raw and letter.payload_bytes == len(raw)
    assert lettered == {where for where, m in placed.items() if m.expected != ACCEPTED}

    # Everything is accounted for: accepted + dead-lettered == sent, in Prometheus and in Redis.
    accepted = summed(agents.web_port, "autoscaler_reports_accepted_total", "job")
    assert accepted == Counter({job: expected[ACCEPTED] - 1, other_job: 1})
    assert accepted.total() + len(got) == len(messages)
    rejected = summed(agents.web_port, "autoscaler_reports_rejected_total", "reason")
    assert rejected == Counter({r: n for r, n in expected.items() if r != ACCEPTED})
    after = counters(settings)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after.keys() | before.keys()}
    assert {k: v for k, v in delta.items() if v} == {"reports_accepted": expected[ACCEPTED]} | {
        f"rejected:{r}": n for r, n in expected.items() if r != ACCEPTED
    }  # and no reports_redelivered: nothing was restarted

    # Still alive and still deciding: a valid job after the bad input gets its decision.
    decisions = Collector(settings, settings.topics.decisions)
    try:
        follow = [MetricReport.model_validate(report(after_job, start + i, "driver")) for i in range(1, 12)]
        send(settings, settings.topics.metrics, [(after_job.encode(), r.to_bytes()) for r in follow])
        decisions.until(ScalingDecision.model_validate_json,
                        lambda d: any(x.job_id == after_job for x in d), timeout=60)
    finally:
        decisions.close()
    assert agents.process.poll() is None
    assert "Traceback" not in agents.log(), agents.log()[-3000:]

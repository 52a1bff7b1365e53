"""`contracts.stage.per_key`: one job's records in order, different jobs' records at the same time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.stage import Incoming, per_key, publish_per_key


def record(key: str, n: int) -> Incoming:
    return Incoming(value=str(n).encode(), key=key.encode())


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 1000)), max_size=40))
def test_each_keys_records_are_handled_once_and_in_order(items: list[tuple[str, int]]) -> None:
    records = [record(key, n) for key, n in items]
    seen: list[Incoming] = []

    async def handle(incoming: Incoming) -> None:
        await asyncio.sleep(0)  # let the other keys interleave
        seen.append(incoming)

    asyncio.run(per_key(records, handle))
    assert sorted(seen, key=id) == sorted(records, key=id)
    for key in "abcd":
        assert [r for r in seen if r.key == key.encode()] == [r for r in records if r.key == key.encode()]


def test_different_keys_wait_at_the_same_time() -> None:
    # Job a's record waits for job b's: handled one after another this would never finish.
    b_started = asyncio.Event()

    async def handle(incoming: Incoming) -> None:
        if incoming.key == b"a":
            await asyncio.wait_for(b_started.wait(), timeout=5)
        else:
            b_started.set()

    asyncio.run(per_key([record("a", 1), record("b", 2)], handle))


def test_an_error_is_raised_after_every_other_record_was_handled() -> None:
    done: list[str] = []

    async def handle(incoming: Incoming) -> None:
        if incoming.key == b"a":
            raise ConnectionError("knowledge away")
        await asyncio.sleep(0.01)
        done.append(incoming.key.decode() if incoming.key else "")

    with pytest.raises(ConnectionError):
        asyncio.run(per_key([record("a", 1), record("b", 2), record("c", 3)], handle))
    assert sorted(done) == ["b", "c"]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.binary(max_size=8)), max_size=40))
def test_published_messages_keep_each_keys_order(messages: list[tuple[str, bytes]]) -> None:
    sent: list[tuple[str, str, bytes]] = []

    async def publish(topic: str, key: str, value: bytes) -> None:
        await asyncio.sleep(0)  # an acknowledgement to wait for: the other keys interleave
        sent.append((topic, key, value))

    asyncio.run(publish_per_key(publish, "windows", messages))
    assert sorted(sent) == sorted(("windows", key, value) for key, value in messages)
    for key in "abcd":
        assert [v for _, k, v in sent if k == key] == [v for k, v in messages if k == key]

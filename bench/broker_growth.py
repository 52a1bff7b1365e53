"""Does a broker request get slower as the broker stores more record batches?

    python -m bench.broker_growth                  # 2,000 to 40,000 stored batches of one record
    python -m bench.broker_growth --batches 2000 --batches 100000

Starts the embedded broker, stores one-record batches over 4 partitions and, at each size, times
ListOffsets(latest) over the 4 partitions and the source's log-end probe (`infra.kafka.LogEndProbe`),
with the broker's CPU time per call. Prints one JSON line per size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated

import typer
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from bench.common import process_cpu_seconds
from infra.kafka import LogEndProbe, ensure_topic
from stack.processes import start_broker

PARTITIONS = 4
PAYLOAD = b'{"id": 123456, "key": "k3", "ts": 1700000000.123}'


def main(batches: Annotated[list[int] | None, typer.Option(help="Stored batches to measure at.")] = None,
         calls: Annotated[int, typer.Option(help="Calls timed at each size.")] = 10) -> None:
    sizes = sorted(batches or [2_000, 10_000, 20_000, 40_000])
    broker = start_broker()
    bootstrap = f"{broker.host}:{broker.port}"
    try:
        ensure_topic(bootstrap, "growth", PARTITIONS)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
        admin = AdminClient({"bootstrap.servers": bootstrap})
        probe = LogEndProbe(bootstrap, "growth")

        def timed(call: Callable[[], object]) -> dict[str, float]:
            cpu, began = process_cpu_seconds(broker.pid), time.perf_counter()
            for _ in range(calls):
                call()
            return {"ms": round((time.perf_counter() - began) / calls * 1000, 1),
                    "broker_cpu_ms": round((process_cpu_seconds(broker.pid) - cpu) / calls * 1000, 1)}

        def list_offsets() -> None:
            request = {TopicPartition("growth", p): OffsetSpec.latest() for p in range(PARTITIONS)}
            for future in admin.list_offsets(request).values():
                future.result()

        stored = 0
        for size in sizes:
            while stored < size:  # one record per produce request: one stored batch each
                for i in range(500):
                    producer.produce("growth", value=PAYLOAD, partition=i % PARTITIONS)
                    producer.poll(0)
                producer.flush()
                stored += 500
            typer.echo(json.dumps({"stored_batches": stored, "list_offsets": timed(list_offsets),
                                   "log_end_probe": timed(lambda: probe.latest(list(range(PARTITIONS))))}))
        probe.close()
    finally:
        broker.stop()


if __name__ == "__main__":
    typer.run(main)

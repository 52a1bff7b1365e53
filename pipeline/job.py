"""What a job's entry point gets from the runner.

An entry point is `module:function` with the signature

    def build(spark: SparkSession, ctx: JobContext) -> DataStreamWriter

It builds the query and returns its writer unstarted; the runner sets the checkpoint location, the
query name and the trigger, starts it, and attaches the metrics reporter. It is called again, with a
new session and a new parallelism, every time the runner rescales the job.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.reporter import OutputCounter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter


@dataclass
class JobContext:
    """job_id, parallelism (task slots), checkpoint_dir (the job's directory: Spark's checkpoint is
    its `query` folder and the job may keep its own files beside it), pause_file (the source admits
    no data while it exists), bootstrap (Kafka), options (the job's `--option key=value` pairs plus
    `minPartitions`), output (count what the sink writes here, for the metrics' records_out),
    kafka_security (SASL/SSL properties, librdkafka names, for the job's own Kafka clients),
    on_stop (what the job's own clients need to close, run once its query has stopped).
    """

    job_id: str
    parallelism: int
    checkpoint_dir: str
    pause_file: str
    bootstrap: str
    options: dict[str, str] = field(default_factory=dict)
    output: OutputCounter = field(default_factory=OutputCounter)
    pausable: bool = False  # set when the job reads through read_kafka with the pausable source
    kafka_security: dict[str, str] = field(default_factory=dict)
    on_stop: list[Callable[[], None]] = field(default_factory=list)  # run when the query has stopped

    @property
    def min_partitions(self) -> int:
        return int(self.options.get("minPartitions", self.parallelism))

    def path(self, name: str) -> Path:
        """A file of the job's own in its directory."""
        return Path(self.checkpoint_dir) / name

    def read_kafka(self, spark: SparkSession, topic: str, starting_offsets: str | None = None) -> DataFrame:
        """The job's Kafka input, split into `minPartitions` read tasks and paused by the runner."""
        from pipeline.kafka_source import native_kafka_available, read_kafka_stream

        if self.kafka_security:
            # The source's options are plain strings in Spark's plan, shipped to every Python
            # worker; secrets do not belong there, and a plaintext read of a secured broker would
            # only hang. Refuse clearly instead.
            raise NotImplementedError(
                "read_kafka cannot read a SASL/SSL-secured Kafka (AUTOSCALER_KAFKA_SECURITY_PROTOCOL is "
                f"{self.kafka_security.get('security.protocol')}); with Spark's kafka connector, call "
                "pipeline.kafka_source.read_kafka_stream with its kafka.security.* / kafka.sasl.* options"
            )

        limit = self.options.get("maxRecordsPerTrigger")
        self.pausable = not native_kafka_available(spark)
        return read_kafka_stream(
            spark,
            self.bootstrap,
            topic,
            starting_offsets=starting_offsets or self.options.get("startingOffsets", "earliest"),
            max_records_per_trigger=int(limit) if limit else None,
            min_partitions=self.min_partitions,
            pause_file=self.pause_file,
            # An in-place backend scales each batch's admission to the executors that run now.
            **({"shareFile": self.options["shareFile"]} if self.pausable and self.options.get("shareFile") else {}),
        )


BuildFunction = Callable[["SparkSession", JobContext], "DataStreamWriter"]


def load_entry_point(spec: str) -> BuildFunction:
    """Import `module:function`. Entry points come from the command line or configuration only."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"an entry point is module:function, not {spec!r}")
    module = importlib.import_module(module_name)
    target = module
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return target  # type: ignore[return-value]

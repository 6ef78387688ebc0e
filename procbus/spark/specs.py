"""A Spark job as data: what to run (load or compact), on which table, into which folder. The
local backend runs a spec in the worker's session; a cluster backend hands it, as JSON, to the
procbus driver on the cluster (procbus.spark.driver), so the job runs without the worker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, Field

from procbus.lakehouse import InputFormat, TableDescriptor
from procbus.lakehouse.data import DataFile
from procbus.spark import jobs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class LoadJob(BaseModel):
    kind: Literal["load"] = "load"
    table: TableDescriptor
    source: str
    format: InputFormat
    output: str


class CompactJob(BaseModel):
    kind: Literal["compact"] = "compact"
    table: TableDescriptor
    inputs: list[DataFile]
    target_file_size: int
    output: str


JobSpec = Annotated[LoadJob | CompactJob, Field(discriminator="kind")]


class JobOutcome(BaseModel):
    """What a driver on the cluster leaves beside its output: the cluster's status of a failed
    driver carries no message."""

    ok: bool
    error: str | None = None
    error_type: str | None = None


def run_spec(spark: SparkSession, spec: LoadJob | CompactJob) -> None:
    if isinstance(spec, LoadJob):
        jobs.load(spark, spec.table, spec.source, spec.format, Path(spec.output))
    else:
        jobs.compact(
            spark,
            spec.table,
            Path(spec.table.location),
            spec.inputs,
            spec.target_file_size,
            Path(spec.output),
        )


def outcome_file(output: str) -> Path:
    """Beside the output folder, never in it: Spark's writer wants that folder new."""
    return Path(f"{output}.outcome.json")


def spec_file(output: str) -> Path:
    """Where a cluster's driver reads its job's spec, beside the output folder: a compaction's
    spec lists every file it reads, too long for a command line (Linux takes 128 KiB an
    argument)."""
    return Path(f"{output}.job.json")

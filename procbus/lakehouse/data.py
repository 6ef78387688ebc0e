"""A table's data: its snapshots and files, and the inputs and results of the procedures that
change them (LoadTable, CompactTable). JSON-friendly models, safe in the workflow sandbox.

A partition is written as Hive writes it, leading partition columns first:
`region=eu/day=2026-11-24`, or only a prefix, `region=eu` (every partition below it).
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from procbus.core import Fence, parse_table_name, table_resource, validate_name
from procbus.errors import InvalidRequest
from procbus.lakehouse.models import TableDescriptor
from procbus.procedures import ProcedureInput

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024  # Spark's and Iceberg's usual file size
MIN_TARGET_FILE_SIZE = 1024
# A partition value must fit a lock path segment (procbus.locks.modes).
_PARTITION_VALUE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}$")


class InputFormat(StrEnum):
    """The file formats LoadTable reads."""

    CSV = "csv"
    JSON = "json"
    PARQUET = "parquet"


class SnapshotOperation(StrEnum):
    LOAD = "load"
    COMPACT = "compact"
    APPLY = "apply"  # a batch of captured changes (procbus.pipeline)


def split_partition(spec: str) -> list[tuple[str, str]]:
    """'region=eu/day=2026-11-24' -> [('region', 'eu'), ('day', '2026-11-24')], each name and
    value checked; whether they are the table's partition columns is `parse_partition`'s."""
    pairs: list[tuple[str, str]] = []
    for part in spec.strip("/").split("/"):
        name, equals, value = part.partition("=")
        if not equals:
            raise InvalidRequest(f"partition {spec!r}: expected COLUMN=VALUE, got {part!r}")
        validate_name("partition column", name)
        if not _PARTITION_VALUE.fullmatch(value):
            raise InvalidRequest(
                f"partition {spec!r}: the value {value!r} of {name} may hold only letters, "
                "digits, '_', '.' and '-'"
            )
        pairs.append((name, value))
    return pairs


def parse_partition(table: TableDescriptor, spec: str) -> list[tuple[str, str]]:
    """A partition of `table` (or a prefix of one): its leading partition columns, in order."""
    if not table.partition_by:
        raise InvalidRequest(f"table {table.qualified_name} is not partitioned")
    pairs = split_partition(spec)
    columns = [name for name, _ in pairs]
    if columns != table.partition_by[: len(columns)]:
        raise InvalidRequest(
            f"partition {spec!r} does not fit {table.qualified_name}, partitioned by "
            f"{'/'.join(table.partition_by)}: name its leading partition columns in order"
        )
    return pairs


def partition_matches(partition: dict[str, str], scope: list[tuple[str, str]]) -> bool:
    """Whether a file's partition lies in `scope` (a partition or a prefix of one)."""
    return all(partition.get(name) == value for name, value in scope)


def partition_resource(namespace: str, table: str, pairs: list[tuple[str, str]]) -> str:
    """The lock resource of a partition (or a prefix of one): below its table's."""
    return "/".join([table_resource(namespace, table), *(f"{c}={v}" for c, v in pairs)])


# ---- catalog objects ----


class DataFile(BaseModel):
    """One Parquet data file of a table: its path relative to the table's folder (a `file:`
    URI when another engine wrote it elsewhere)."""

    path: str
    partition: dict[str, str] = Field(default_factory=dict)
    records: int = Field(description="rows in the file, before deletes")
    bytes: int
    deletes: list[str] = Field(
        default_factory=list,
        description="URIs of the position-delete files that delete rows of it (a change apply's)",
    )


class Snapshot(BaseModel):
    """An Iceberg snapshot of a table: procbus's operation (load, compact, apply) or, for a
    snapshot another engine committed, Iceberg's (append, overwrite, ...)."""

    snapshot_id: int
    parent_id: int | None
    operation: str
    job_key: str
    procedure_id: str
    files_added: int
    files_removed: int
    records_added: int
    records_removed: int
    committed_at: datetime | None = None


class TableFiles(BaseModel):
    """A snapshot whole: the table, the snapshot's ID (None: no data yet) and its files."""

    table: TableDescriptor
    snapshot_id: int | None
    files: list[DataFile]
    metadata_location: str = Field(default="", description="the metadata it was read from")

    @property
    def records(self) -> int:
        return sum(file.records for file in self.files)


# ---- procedure inputs ----


class LoadTableInput(ProcedureInput):
    """Input of LoadTable: append the rows of files to a table."""

    table: str = Field(description="NAMESPACE.TABLE")
    source: str = Field(description="a file or folder the workers can read")
    job_heartbeat_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        description="a Spark job whose worker sends no progress this long is run again elsewhere",
    )
    format: InputFormat = Field(
        default=InputFormat.CSV, description="csv (with a header), json, parquet"
    )

    def check(self) -> tuple[str, str]:
        if not self.source.strip():
            raise InvalidRequest("the source path is empty")
        return parse_table_name(self.table)


class CompactTableInput(ProcedureInput):
    """Input of CompactTable: rewrite a table's small files into fewer, larger ones."""

    table: str = Field(description="NAMESPACE.TABLE")
    partitions: list[str] = Field(
        default_factory=list,
        description="Hive-style partitions to compact, e.g. 'region=eu'; empty: the whole table",
    )
    job_heartbeat_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        description="a Spark job whose worker sends no progress this long is run again elsewhere",
    )
    target_file_size: int = Field(
        default=DEFAULT_TARGET_FILE_SIZE,
        description="bytes; small files are rewritten into files near this size",
    )

    def check(self) -> tuple[str, str]:
        if self.target_file_size < MIN_TARGET_FILE_SIZE:
            raise InvalidRequest(
                f"the target file size must be at least {MIN_TARGET_FILE_SIZE} bytes, "
                f"got {self.target_file_size}"
            )
        for partition in self.partitions:
            split_partition(partition)
        return parse_table_name(self.table)


# ---- steps and results ----


class SparkJobStep(BaseModel):
    """What a data step's Spark job works on; the job key names it in the ledger."""

    procedure_id: str
    job_key: str
    table: TableDescriptor
    principal: str | None = None  # who asks: its verified principal, who must write the table


class LoadStep(SparkJobStep):
    source: str
    format: InputFormat


class CompactionPlan(BaseModel):
    """The files a compaction rewrites, per partition, as the snapshot it starts from has them."""

    partitions: list[str] = Field(default_factory=list, description="empty: the whole table")
    target_file_size: int
    inputs: list[DataFile] = Field(default_factory=list)
    snapshot_id: int | None = Field(default=None, description="the snapshot the plan read")


class CompactStep(SparkJobStep):
    plan: CompactionPlan


class StagedOutput(BaseModel):
    """A finished job attempt's files, still in its staging folder (invisible to readers)."""

    job_key: str
    attempt_token: str
    files: list[DataFile]

    @property
    def records(self) -> int:
        return sum(file.records for file in self.files)


class CommitStep(BaseModel):
    procedure_id: str
    table: TableDescriptor
    operation: SnapshotOperation
    output: StagedOutput
    removes: list[DataFile] = Field(default_factory=list)
    fences: list[Fence] = Field(default_factory=list, description="of every lock the step holds")
    based_on: int | None = Field(
        default=None,
        description="a compaction's planned snapshot: on a merge-on-read table, a file committed "
        "after it makes the commit a SnapshotConflict (the fold would hide its changes)",
    )


class DataResult(BaseModel):
    """The result of LoadTable or CompactTable: the snapshot committed and its files."""

    table: str
    snapshot_id: int | None = Field(description="the snapshot committed; None: nothing to do")
    files_added: int = 0
    files_removed: int = 0
    records: int = 0
    message: str = ""

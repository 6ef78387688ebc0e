"""Lake tables as Apache Iceberg tables (format v2), in the Iceberg SQL catalog that lives in
procbus's PostgreSQL (`iceberg_tables`, `iceberg_namespace_properties`: the schema pyiceberg's
SqlCatalog and Iceberg's JdbcCatalog share), so any Iceberg engine reads what procbus writes.

pyiceberg builds every commit (manifests, manifest list, the next metadata file), but never
writes a catalog row: `StagingCatalog` only records each table's new metadata file, and procbus
moves the catalog rows itself, by compare-and-set, inside the PostgreSQL transaction that also
checks its fences and records its job, batch or position. So one transaction commits several
tables at once, which Iceberg's own catalogs cannot (apache/iceberg#11944).

What runs here is synchronous file I/O (metadata, manifests, Parquet footers): callers run it
in a thread. The catalog rows are procbus.lakehouse.catalog's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.exceptions import ValidationError
from pyiceberg.io import load_file_io
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table import CommitTableResponse, Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    TableRequirement,
    TableUpdate,
    update_table_metadata,
)
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from procbus.errors import InvalidRequest, SnapshotConflict
from procbus.lakehouse.schemas import Column

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergDataFile

# Every catalog row carries it, and an engine's catalog must be configured with the same name.
CATALOG_NAME = "procbus"
FORMAT_VERSION = 2
# Written into every snapshot procbus commits: which job or batch it was (its idempotency key)
# and which procedure; readable by any engine from the snapshot's summary.
JOB_KEY_PROPERTY = "procbus.job-key"
PROCEDURE_PROPERTY = "procbus.procedure"
METADATA_FOLDER = "metadata"
# Partition fields take IDs from here on, as Iceberg numbers them.
FIRST_PARTITION_FIELD_ID = 1000

_SIMPLE_TYPES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "bigint": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    # Spark's timestamp is an instant (UTC micros): Iceberg's timestamptz.
    "timestamp": TimestamptzType(),
}


def iceberg_type(column_type: str) -> IcebergType:
    """The Iceberg type of a catalog column type (procbus.lakehouse.schemas, normalized);
    InvalidRequest for one Iceberg lacks."""
    if column_type in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[column_type]
    if column_type.startswith("decimal("):
        precision, scale = column_type.removeprefix("decimal(").removesuffix(")").split(",")
        return DecimalType(int(precision), int(scale))
    raise InvalidRequest(
        f"column type {column_type!r} has no Apache Iceberg type: use int (Iceberg has no "
        "tinyint or smallint), bigint, float, double, decimal(p,s), boolean, string, binary, "
        "date or timestamp"
    )


def table_schema(columns: Sequence[Column]) -> Schema:
    """The Iceberg schema of a table's columns, field IDs from 1 in order. Every column is
    optional: Spark writes nullable columns, and a required column refuses their files."""
    return Schema(
        *(
            NestedField(field_id=number, name=column.name, field_type=iceberg_type(column.type))
            for number, column in enumerate(columns, start=1)
        )
    )


def partition_spec(schema: Schema, partition_by: Sequence[str]) -> PartitionSpec:
    """Hive-style partitioning as Iceberg identity partitions; InvalidRequest for a column the
    transform does not apply to."""
    fields = [
        PartitionField(
            source_id=schema.find_field(name).field_id,
            field_id=FIRST_PARTITION_FIELD_ID + place,
            transform=IdentityTransform(),
            name=name,
        )
        for place, name in enumerate(partition_by)
    ]
    spec = PartitionSpec(*fields)
    try:
        spec.check_compatible(schema)
    except ValidationError as misfit:
        raise InvalidRequest(f"the partitioning does not apply: {misfit}") from None
    return spec


def file_uri(path: str | Path) -> str:
    """One spelling of a local path, `file:///abs/path`: Iceberg compares paths as strings."""
    text = str(path)
    if text.startswith("file:"):
        text = text.removeprefix("file:").lstrip("/")
        return f"file:///{text}"
    return Path(text).absolute().as_uri()


def local_path(uri: str) -> Path:
    """The local path of a `file:` URI (Spark writes `file:/p`, pyiceberg `file:///p`)."""
    return (
        Path("/" + uri.removeprefix("file:").lstrip("/")) if uri.startswith("file:") else Path(uri)
    )


def new_table(
    location: Path,
    columns: Sequence[Column],
    partition_by: Sequence[str],
    properties: dict[str, str],
) -> str:
    """Write a new table's first metadata file under `location`/metadata; its location. The name
    mapping lets every reader match columns of files written without Iceberg field IDs (Spark's
    plain Parquet) by name."""
    schema = table_schema(columns)
    spec = partition_spec(schema, partition_by)
    mapping = create_mapping_from_schema(schema).model_dump_json()
    metadata = new_table_metadata(
        schema=schema,
        partition_spec=spec,
        sort_order=UNSORTED_SORT_ORDER,
        location=file_uri(location),
        properties={
            **properties,
            TableProperties.FORMAT_VERSION: str(FORMAT_VERSION),
            TableProperties.DEFAULT_NAME_MAPPING: mapping,
        },
    )
    provider = load_location_provider(metadata.location, metadata.properties)
    metadata_location = provider.new_table_metadata_file_location(0)
    io = load_file_io(metadata.properties, metadata_location)
    ToOutputFile.table_metadata(metadata, io.new_output(metadata_location))
    return metadata_location


@dataclass(frozen=True)
class PendingCommit:
    """A table's next metadata file, written and not yet in the catalog: the row moves from
    `base_location` to `new_location` by compare-and-set, or the commit is lost."""

    namespace: str
    name: str
    base_location: str
    new_location: str
    metadata: TableMetadata


class StagingCatalog(NoopCatalog):
    """The catalog pyiceberg commits through: it validates the commit on the metadata the
    caller loaded, writes the next metadata file, and records it in `pending`; the row itself
    is moved by the caller (procbus.lakehouse.catalog), in its own transaction."""

    def __init__(self) -> None:
        super().__init__(CATALOG_NAME)
        self.pending: list[PendingCommit] = []
        # Snapshots staged as overwrites that only rewrite files: committed as 'replace', which
        # incremental readers skip (pyiceberg has no producer of its own for them).
        self.replacing: set[int] = set()

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        base = table.metadata
        for requirement in requirements:
            requirement.validate(base)
        updates = tuple(self._relabel(update) for update in updates)
        metadata = update_table_metadata(
            base_metadata=base, updates=updates, metadata_location=table.metadata_location
        )
        version = MetastoreCatalog._parse_metadata_version(table.metadata_location) + 1
        provider = load_location_provider(metadata.location, metadata.properties)
        location = provider.new_table_metadata_file_location(version)
        io = load_file_io({**self.properties, **metadata.properties}, location)
        ToOutputFile.table_metadata(metadata, io.new_output(location))  # refuses to overwrite
        namespace, name = table.name()[-2:]
        self.pending.append(
            PendingCommit(namespace, name, table.metadata_location, location, metadata)
        )
        return CommitTableResponse.model_validate(
            {"metadata": metadata, "metadata-location": location}
        )

    def _relabel(self, update: TableUpdate) -> TableUpdate:
        if isinstance(update, AddSnapshotUpdate) and update.snapshot.snapshot_id in self.replacing:
            snapshot = update.snapshot
            summary = snapshot.summary
            assert summary is not None  # a staged snapshot always has one
            relabeled = Summary(Operation.REPLACE, **summary.additional_properties)
            return AddSnapshotUpdate(snapshot=snapshot.model_copy(update={"summary": relabeled}))
        return update


def load_table(catalog: StagingCatalog, namespace: str, name: str, metadata_location: str) -> Table:
    """The table as its metadata file at `metadata_location` (read from its catalog row) has it."""
    io = load_file_io(catalog.properties, metadata_location)
    metadata = FromInputFile.table_metadata(io.new_input(metadata_location))
    return Table(
        identifier=(namespace, name),
        metadata=metadata,
        metadata_location=metadata_location,
        io=load_file_io({**catalog.properties, **metadata.properties}, metadata_location),
        catalog=catalog,
    )


def snapshot_properties(job_key: str, procedure_id: str) -> dict[str, str]:
    return {JOB_KEY_PROPERTY: job_key, PROCEDURE_PROPERTY: procedure_id}


def data_files(table: Table, paths: Iterable[str]) -> list[IcebergDataFile]:
    """Iceberg's record of Parquet files written for `table` (from their footers: rows, sizes,
    column bounds, partition); InvalidRequest for a file that does not fit the schema."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    try:
        return [parquet_file_to_data_file(table.io, table.metadata, path) for path in paths]
    except (ValueError, TypeError) as misfit:
        raise InvalidRequest(f"a file does not fit {'.'.join(table.name())}: {misfit}") from None


def stage_commit(
    table: Table,
    adds: Sequence[str],
    removes: Sequence[str],
    properties: dict[str, str],
) -> int:
    """Stage one snapshot that adds the Parquet files `adds` and removes the live data files
    `removes` (a compaction: committed as 'replace'); its ID. SnapshotConflict when a file to
    remove is no longer live (another commit replaced it first)."""
    from pyiceberg.exceptions import ValidationException

    staging = table.catalog
    assert isinstance(staging, StagingCatalog)
    added = data_files(table, adds)
    with table.transaction() as transaction:
        if not removes:
            with transaction.update_snapshot(
                snapshot_properties=properties
            ).fast_append() as append:
                for file in added:
                    append.append_data_file(file)
            return append.snapshot_id
        live = live_data_files(table)
        gone = [path for path in removes if path not in live]
        if gone:
            raise SnapshotConflict(
                f"{'.'.join(table.name())}: {len(gone)} of the {len(removes)} files this commit "
                f"replaces are no longer live (first: {gone[0]}); nothing committed"
            )
        try:
            update = transaction.update_snapshot(snapshot_properties=properties)
            with update.overwrite() as overwrite:
                for path in removes:
                    overwrite.delete_data_file(live[path])
                for file in added:
                    overwrite.append_data_file(file)
                staging.replacing.add(overwrite.snapshot_id)
        except ValidationException as conflict:
            raise SnapshotConflict(f"{'.'.join(table.name())}: {conflict}") from None
        return overwrite.snapshot_id


def live_data_files(table: Table, snapshot: Snapshot | None = None) -> dict[str, IcebergDataFile]:
    """The data files of a snapshot (the current one by default), by path."""
    snapshot = snapshot or table.current_snapshot()
    if snapshot is None:
        return {}
    files: dict[str, IcebergDataFile] = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                files[entry.data_file.file_path] = entry.data_file
    return files


def new_uuid() -> str:
    return uuid.uuid4().hex


def summary_of(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot's summary as plain values: its operation and its properties."""
    summary = snapshot.summary
    if summary is None:
        return {}
    return {"operation": summary.operation.value, **summary.additional_properties}

"""A lake table's Iceberg metadata (format v2): its schema and partitioning from the catalog's
columns, its first metadata file, the next ones a commit writes, and the table as its catalog row
points at it.

The metadata lives in the Iceberg SQL catalog in procbus's PostgreSQL (`iceberg_tables`,
`iceberg_namespace_properties`: the schema pyiceberg's SqlCatalog and Iceberg's JdbcCatalog
share), so any Iceberg engine reads what procbus writes. pyiceberg builds every commit
(manifests, manifest list, the next metadata file), but never writes a catalog row:
`StagingCatalog` only records each table's new metadata file, and procbus moves the catalog rows
itself, by compare-and-set, inside the PostgreSQL transaction that also checks its fences and
records its job, batch or position (procbus.lakehouse.commits). So one transaction commits
several tables at once, which Iceberg's own catalogs cannot (apache/iceberg#11944).

What runs here is synchronous file I/O (metadata, manifests, Parquet footers): callers run it
in a thread.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from procbus.errors import InvalidRequest, needs_extra
from procbus.lakehouse.naming import CATALOG_NAME, METADATA_FOLDER
from procbus.lakehouse.pyiceberg_private import next_metadata_version, updated_metadata
from procbus.lakehouse.schemas import Column
from procbus.lakehouse.warehouse import file_uri, local_path

with needs_extra("lake"):
    from pyiceberg.catalog.noop import NoopCatalog
    from pyiceberg.exceptions import ValidationError
    from pyiceberg.io import load_file_io
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.serializers import FromInputFile, ToOutputFile
    from pyiceberg.table import CommitTableResponse, Table, TableProperties
    from pyiceberg.table.locations import load_location_provider
    from pyiceberg.table.metadata import TableMetadata, new_table_metadata
    from pyiceberg.table.name_mapping import create_mapping_from_schema
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.table.update import AddSnapshotUpdate, TableRequirement, TableUpdate
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

FORMAT_VERSION: Literal[2] = 2
# Small data manifests are merged into one once a table has this many (Iceberg's default: 100).
MANIFESTS_BEFORE_MERGE = 8
# Partition fields take IDs from here on, as Iceberg numbers them.
FIRST_PARTITION_FIELD_ID = 1000
# A table's UUID is derived from its creating procedure under this namespace (see new_table).
TABLE_IDENTITY = uuid.UUID("5f0c3e52-7a0e-4d4f-9a61-2b8f1f6c0a11")
# The position-delete file's columns, with the field IDs the Iceberg spec reserves for them.
DELETE_PATH_FIELD_ID = 2147483546
DELETE_POS_FIELD_ID = 2147483545

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


def catalog_type(field_type: IcebergType) -> str | None:
    """The catalog column type of an Iceberg type, iceberg_type's inverse; None for one the
    catalog has no type for (nested types, uuid, time, fixed, a timestamp without its zone)."""
    for column_type, simple in _SIMPLE_TYPES.items():
        if field_type == simple:
            return column_type
    if isinstance(field_type, DecimalType):
        return f"decimal({field_type.precision},{field_type.scale})"
    return None


def schema_columns(schema: Schema) -> list[Column]:
    """A table's columns as its Iceberg schema has them, in its order: what another engine
    added or dropped included. A column of a type the catalog lacks is left out: procbus
    neither loads nor shows it (its value in rows procbus writes is null, as for any optional
    column a file lacks); the engines that know its type read it."""
    return [
        Column(name=field.name, type=column_type)
        for field in schema.fields
        if (column_type := catalog_type(field.field_type)) is not None
    ]


def columns_left_out(schema: Schema) -> list[str]:
    """The columns schema_columns leaves out, each as `name (Iceberg type)`: a rewrite of the
    table's files by procbus would lose their values."""
    return [
        f"{field.name} ({field.field_type})"
        for field in schema.fields
        if catalog_type(field.field_type) is None
    ]


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
    schema lacks or the transform does not apply to."""
    missing = [name for name in partition_by if name not in schema.column_names]
    if missing:
        raise InvalidRequest(f"the partitioning does not apply: {missing[0]!r} is no column")
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


def new_table(
    location: Path,
    columns: Sequence[Column],
    partition_by: Sequence[str],
    properties: dict[str, str],
    created_by: str = "",
) -> str:
    """Write a new table's first metadata file under `location`/metadata; its location. The name
    mapping lets every reader match columns of files written without Iceberg field IDs (Spark's
    plain Parquet) by name.

    The file and the table's UUID are named after `created_by` (the creating procedure) and the
    location, so a creation tried again after an attempt that wrote the file but never committed
    its row replaces that file instead of leaving it unlisted beside its own. Without a creator
    (tables made outside a procedure) both are random."""
    identity = (
        uuid.uuid5(TABLE_IDENTITY, f"{created_by}:{file_uri(location)}")
        if created_by
        else uuid.uuid4()
    )
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
            # Appends merge small manifests, as Iceberg's Java writers do by default, and early:
            # a pipeline commits often, and every reader's plan reads every manifest.
            TableProperties.MANIFEST_MERGE_ENABLED: "true",
            TableProperties.MANIFEST_MIN_MERGE_COUNT: str(MANIFESTS_BEFORE_MERGE),
        },
        table_uuid=identity,
    )
    provider = load_location_provider(metadata.location, metadata.properties)
    metadata_location = provider.new_metadata_location(f"00000-{identity}.metadata.json")
    # Written aside and renamed over: an attempt that lost its worker may still be writing.
    final = local_path(metadata_location)
    aside = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
    io = load_file_io(metadata.properties, metadata_location)
    ToOutputFile.table_metadata(metadata, io.new_output(file_uri(aside)))
    os.replace(aside, final)
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
        metadata = updated_metadata(base, updates, table.metadata_location)
        version = next_metadata_version(table.metadata_location)
        provider = load_location_provider(metadata.location, metadata.properties)
        location = provider.new_table_metadata_file_location(version)
        io = load_file_io({**self.properties, **metadata.properties}, location)
        ToOutputFile.table_metadata(metadata, io.new_output(location))  # refuses to overwrite
        _remember_metadata(location, _file_version(location), metadata)
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


def load_table(
    catalog: StagingCatalog, namespace: str, name: str, metadata_location: str, folder: Path
) -> Table:
    """The table as its metadata file at `metadata_location` (read from its catalog row) has it.
    The row is input anyone who writes the database can forge: metadata outside the table's own
    `folder`, or naming another folder as the table's, is refused before procbus reads a data
    file by it or writes a file where it says."""
    base = folder.resolve()
    where = f"table {namespace}.{name}'s Iceberg catalog row points at {metadata_location}"
    if not local_path(metadata_location).resolve().is_relative_to(base / METADATA_FOLDER):
        raise InvalidRequest(f"{where}, outside its folder {base}: refused, nothing read")
    metadata = _metadata_at(catalog, metadata_location)
    if local_path(metadata.location).resolve() != base:
        raise InvalidRequest(
            f"{where}, whose table lives in {metadata.location}, not {base}: refused, nothing read"
        )
    return Table(
        identifier=(namespace, name),
        metadata=metadata,
        metadata_location=metadata_location,
        io=load_file_io({**catalog.properties, **metadata.properties}, metadata_location),
        catalog=catalog,
    )


# The metadata files read or written last, kept parsed while the file is the same (its inode,
# size and change time): a pipeline's commit builds on the metadata its last one wrote, and
# parsing it again (every snapshot in it) was a large part of a commit.
METADATA_KEPT = 64
_metadata_read: OrderedDict[str, tuple[tuple[int, int, int], TableMetadata]] = OrderedDict()
_metadata_lock = threading.Lock()


def _file_version(location: str) -> tuple[int, int, int]:
    found = os.stat(local_path(location))
    return found.st_ino, found.st_size, found.st_mtime_ns


def _metadata_at(catalog: StagingCatalog, location: str) -> TableMetadata:
    version = _file_version(location)
    with _metadata_lock:
        kept = _metadata_read.get(location)
        if kept is not None and kept[0] == version:
            _metadata_read.move_to_end(location)
            return kept[1]
    io = load_file_io(catalog.properties, location)
    metadata = FromInputFile.table_metadata(io.new_input(location))
    _remember_metadata(location, version, metadata)
    return metadata


def _remember_metadata(
    location: str, version: tuple[int, int, int], metadata: TableMetadata
) -> None:
    with _metadata_lock:
        _metadata_read[location] = (version, metadata)
        while len(_metadata_read) > METADATA_KEPT:
            _metadata_read.popitem(last=False)

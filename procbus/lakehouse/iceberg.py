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

import os
import secrets
import threading
import uuid
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.exceptions import ValidationError
from pyiceberg.io import load_file_io
from pyiceberg.manifest import (
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table import CommitTableResponse, Table, TableProperties, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.snapshot import _MergeAppendFiles, _OverwriteFiles
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import EMPTY_DICT
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
    PrimitiveType,
    StringType,
    TimestamptzType,
)
from pyiceberg.utils.datetime import datetime_to_millis

from procbus.errors import InvalidRequest, SnapshotConflict
from procbus.lakehouse.key_index import KEY_INDEX

# Names and paths (kept free of pyiceberg there), used through this module too.
from procbus.lakehouse.naming import CATALOG_NAME as CATALOG_NAME
from procbus.lakehouse.naming import JOB_KEY_PROPERTY as JOB_KEY_PROPERTY
from procbus.lakehouse.naming import METADATA_FOLDER as METADATA_FOLDER
from procbus.lakehouse.naming import OPERATION_PROPERTY as OPERATION_PROPERTY
from procbus.lakehouse.naming import PROCEDURE_PROPERTY as PROCEDURE_PROPERTY
from procbus.lakehouse.naming import SnapshotSummary as SnapshotSummary
from procbus.lakehouse.naming import snapshot_properties as snapshot_properties
from procbus.lakehouse.schemas import Column
from procbus.lakehouse.warehouse import DATA_FOLDER
from procbus.lakehouse.warehouse import file_uri as file_uri
from procbus.lakehouse.warehouse import local_path as local_path
from procbus.lakehouse.warehouse import path_in as path_in
from procbus.lakehouse.warehouse import uri_in as uri_in

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.manifest import DataFile as IcebergDataFile

FORMAT_VERSION: Literal[2] = 2
# Small data manifests are merged into one once a table has this many (Iceberg's default: 100).
MANIFESTS_BEFORE_MERGE = 8
# Partition fields take IDs from here on, as Iceberg numbers them.
FIRST_PARTITION_FIELD_ID = 1000
# A table's UUID is derived from its creating procedure under this namespace (see new_table).
TABLE_IDENTITY = uuid.UUID("5f0c3e52-7a0e-4d4f-9a61-2b8f1f6c0a11")

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


def updated_metadata(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """pyiceberg's update_table_metadata (0.12, pinned) without its last step, a deep copy of
    the whole metadata (every snapshot in it): its models are frozen and each update builds new
    ones, so the copy guards nothing, and it was most of a pipeline commit's time once the table
    had some hundred snapshots."""
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if context.has_changes():
        if metadata_location:
            metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            now = datetime_to_millis(datetime.now().astimezone())
            metadata = metadata.model_copy(update={"last_updated_ms": now})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


class _Transaction(Transaction):
    """pyiceberg's Transaction, its staged metadata built once per change staged (pyiceberg
    builds it again each time it is read, several times a commit), without a deep copy."""

    _built: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        built = self._built
        if built is None or built[0] is not self._table.metadata or built[1] is not self._updates:
            metadata = updated_metadata(self._table.metadata, self._updates)
            built = self._built = (self._table.metadata, self._updates, metadata)
        return built[2]


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
        version = MetastoreCatalog._parse_metadata_version(table.metadata_location) + 1
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
    based_on: int | None = None,
) -> int:
    """Stage one snapshot that adds the Parquet files `adds` and removes the live data files
    `removes` (a compaction: committed as 'replace'); its ID. SnapshotConflict when a file to
    remove is no longer live (another commit replaced it first), or when a commit after
    snapshot `based_on` (the one the rewrite read) deleted rows of one by position: the
    rewritten files would bring those rows back."""
    from pyiceberg.exceptions import ValidationException

    staging = table.catalog
    assert isinstance(staging, StagingCatalog)
    added = data_files(table, adds)
    with _Transaction(table) as transaction:
        if not removes:
            # A merge append (no delete files): pyiceberg's own, with a JSON-safe snapshot ID.
            append = _RowDelta(
                operation=Operation.APPEND,
                transaction=transaction,
                io=table.io,
                snapshot_properties=properties,
            )
            with append:
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
        _check_no_deletes_since(table, based_on, removes)
        remaining = set(live) - set(removes)
        try:
            rewrite = _Rewrite(
                operation=Operation.OVERWRITE,
                transaction=transaction,
                io=table.io,
                snapshot_properties=properties,
            )
            with rewrite:
                for path in removes:
                    rewrite.delete_data_file(live[path])
                for file in added:
                    rewrite.append_data_file(file)
                rewrite.dropped_deletes = _deletes_of_none_but(table, removes, remaining)
                staging.replacing.add(rewrite.snapshot_id)
        except ValidationException as conflict:
            raise SnapshotConflict(f"{'.'.join(table.name())}: {conflict}") from None
        return rewrite.snapshot_id


def _deletes_of_none_but(
    table: Table, removes: Sequence[str], remaining: set[str]
) -> list[IcebergDataFile]:
    """The live delete files that name rows of `removes` and of no file in `remaining`: once
    those files go, the deletes delete nothing, and the rewrite drops them too."""
    import pyarrow.parquet as parquet

    current = table.current_snapshot()
    if current is None:
        return []
    dropped = []
    for manifest in current.manifests(table.io):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            deletes = entry.data_file
            if not any(_names_path(deletes, path) for path in removes):
                continue
            with table.io.new_input(deletes.file_path).open() as stream:
                named = set(
                    parquet.read_table(stream, columns=["file_path"])["file_path"]
                    .unique()
                    .to_pylist()
                )
            if not named & remaining:
                dropped.append(deletes)
    return dropped


def _check_no_deletes_since(table: Table, based_on: int | None, removes: Sequence[str]) -> None:
    """SnapshotConflict if a delete file committed after snapshot `based_on` may name a row
    of `removes` (by the bounds of the paths it names)."""
    current = table.current_snapshot()
    newer: list[Snapshot] = []
    while current is not None and current.snapshot_id != based_on:
        newer.append(current)
        parent = current.parent_snapshot_id
        current = table.snapshot_by_id(parent) if parent is not None else None
    for snapshot in newer:
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DELETES:
                continue
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if any(_names_path(entry.data_file, path) for path in removes):
                    raise SnapshotConflict(
                        f"{'.'.join(table.name())}: snapshot {snapshot.snapshot_id}, committed "
                        f"after snapshot {based_on} that this rewrite read, deleted rows of its "
                        "inputs; its files would bring them back, so nothing was committed: "
                        "plan again"
                    )


def _names_path(delete_file: IcebergDataFile, path: str) -> bool:
    lower = (delete_file.lower_bounds or {}).get(DELETE_PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(DELETE_PATH_FIELD_ID)
    if lower is None or upper is None:
        return True  # no bounds: it may name any file
    return lower.decode() <= path <= upper.decode()


def live_data_files(table: Table, snapshot: Snapshot | None = None) -> dict[str, IcebergDataFile]:
    """The data files of a snapshot (the current one by default), by path."""
    snapshot = snapshot or table.current_snapshot()
    if snapshot is None:
        return {}
    files: dict[str, IcebergDataFile] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest_entries(table, manifest):
            if entry.data_file.content == DataFileContent.DATA:
                files[entry.data_file.file_path] = entry.data_file
    return files


# Manifests are never rewritten in place (a new one is written instead), so their live entries
# are kept by path: a pipeline's commit reads only the manifests that are new since the last.
MANIFESTS_KEPT = 512
_manifests_read: OrderedDict[tuple[str, int], tuple[ManifestEntry, ...]] = OrderedDict()
_manifests_lock = threading.Lock()


def manifest_entries(table: Table, manifest: ManifestFile) -> tuple[ManifestEntry, ...]:
    """A manifest's live entries (those not marked deleted), read once while it is among the
    MANIFESTS_KEPT read last. Callers only read them."""
    key = (manifest.manifest_path, manifest.manifest_length)
    with _manifests_lock:
        entries = _manifests_read.get(key)
        if entries is not None:
            _manifests_read.move_to_end(key)
            return entries
    entries = tuple(manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    with _manifests_lock:
        _manifests_read[key] = entries
        while len(_manifests_read) > MANIFESTS_KEPT:
            _manifests_read.popitem(last=False)
    return entries


def new_uuid() -> str:
    return uuid.uuid4().hex


def summary_of(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot's summary as plain values: its operation and its properties."""
    summary = snapshot.summary
    if summary is None:
        return {}
    return {"operation": summary.operation.value, **summary.additional_properties}


# ---- row-level changes: merge-on-read with position deletes ----

# The position-delete file's columns, with the field IDs the Iceberg spec reserves for them.
DELETE_PATH_FIELD_ID = 2147483546
DELETE_POS_FIELD_ID = 2147483545


def position_delete_schema() -> pyarrow.Schema:
    import pyarrow

    def field(name: str, kind: pyarrow.DataType, field_id: int) -> pyarrow.Field:
        return pyarrow.field(
            name, kind, nullable=False, metadata={"PARQUET:field_id": str(field_id)}
        )

    return pyarrow.schema(
        [
            field("file_path", pyarrow.string(), DELETE_PATH_FIELD_ID),
            field("pos", pyarrow.int64(), DELETE_POS_FIELD_ID),
        ]
    )


# Files whose key columns are read at once by a batch's position lookup: Parquet decoding and
# the membership test release the GIL, so two to four files read faster than one at a time.
KEY_READ_THREADS = min(4, os.cpu_count() or 1)


def positions_of(
    table: Table, keys: pyarrow.Table, files: Iterable[IcebergDataFile]
) -> pyarrow.Table:
    """Where the rows with these keys are in `files` (file_path, pos), sorted as the spec asks.
    Only the key columns are read, several files at once, or found in those the worker keeps
    sorted (KEY_INDEX); a file whose column bounds exclude every key is skipped."""
    import pyarrow

    wanted = keys.group_by(keys.column_names).aggregate([])  # each key once
    may_hold = _bounds_test(table, wanted)
    candidates = [file for file in files if may_hold(file)]
    with ThreadPoolExecutor(KEY_READ_THREADS) as pool:
        looked_up = list(pool.map(lambda file: _positions_in(table, file, wanted), candidates))
    hits = [positions for positions, _ in looked_up]
    # Sorted for the next batches once this one's reads are done (sorting beside them slowed
    # them by half on 2 cores).
    for file, (_, read) in zip(candidates, looked_up, strict=True):
        if read is not None:
            KEY_INDEX.index_later(
                file.file_path, file.file_size_in_bytes, wanted.column_names[0], read.column(0)
            )
    found = [
        pyarrow.table(
            [pyarrow.array([file.file_path] * len(positions), pyarrow.string()), positions],
            schema=position_delete_schema(),
        )
        for file, positions in zip(candidates, hits, strict=True)
        if len(positions)
    ]
    if not found:
        return position_delete_schema().empty_table()
    return pyarrow.concat_tables(found).sort_by([("file_path", "ascending"), ("pos", "ascending")])


def _positions_in(
    table: Table, file: IcebergDataFile, wanted: pyarrow.Table
) -> tuple[pyarrow.Array, pyarrow.Table | None]:
    """The positions in one data file of the rows whose key is in `wanted` (each key once); and
    the one-column key it read to find them, for KEY_INDEX to keep (None: found there)."""
    import pyarrow
    import pyarrow.compute as compute
    import pyarrow.parquet as parquet

    key_names = wanted.column_names
    if len(key_names) == 1:
        indexed = KEY_INDEX.get(file.file_path, file.file_size_in_bytes, key_names[0])
        if indexed is not None:  # sorted after a batch before: no read
            return indexed.positions_of(wanted.column(0)), None
    with table.io.new_input(file.file_path).open() as stream:
        rows = parquet.read_table(stream, columns=key_names, use_threads=False)
    if len(key_names) == 1:
        # One key column: a hash-set membership test, several times faster than a join.
        column = rows.column(0)
        value_set = wanted.column(0).cast(column.type)
        positions = compute.indices_nonzero(compute.is_in(column, value_set=value_set))
        return positions.cast(pyarrow.int64()), rows
    rows = rows.append_column("pos", pyarrow.array(range(rows.num_rows), pyarrow.int64()))
    return rows.join(wanted, key_names, join_type="inner").column("pos").combine_chunks(), None


def _bounds_test(table: Table, keys: pyarrow.Table) -> Callable[[IcebergDataFile], bool]:
    """Whether a data file's bounds on a one-column key leave room for any of `keys`: the keys
    sorted once, then one binary search a file (a table of some thousand files is tested in
    milliseconds, where a pass over the keys for each file took most of a commit)."""
    from pyiceberg.conversions import from_bytes

    if keys.num_rows == 0:
        return lambda file: False
    field = table.schema().find_field(keys.column_names[0])
    field_id, field_type = field.field_id, field.field_type
    if keys.num_columns != 1 or not isinstance(field_type, PrimitiveType):
        return lambda file: True
    ordered = sorted(keys.column(0).drop_null().to_pylist())

    def may_hold(file: IcebergDataFile) -> bool:
        lower = (file.lower_bounds or {}).get(field_id)
        upper = (file.upper_bounds or {}).get(field_id)
        if lower is None or upper is None:
            return True
        low, high = from_bytes(field_type, lower), from_bytes(field_type, upper)
        try:
            at = bisect_left(ordered, low)
            return at < len(ordered) and ordered[at] <= high
        except TypeError:
            return True  # bounds not comparable with the keys' values (dates): read the file

    return may_hold


def write_position_deletes(table: Table, positions: pyarrow.Table, name: str) -> IcebergDataFile:
    """Write `positions` as a position-delete file of `table`, named `name`; its record, with
    the bounds of the paths it names so readers match it only to those files."""
    import pyarrow.parquet as parquet
    from pyiceberg.manifest import DataFile, FileFormat
    from pyiceberg.typedef import Record

    location = table.location_provider().new_data_location(name)
    with table.io.new_output(location).create(overwrite=False) as stream:
        parquet.write_table(positions, stream)
    paths = positions.column("file_path")
    first, last = paths[0].as_py(), paths[-1].as_py()  # sorted by path
    return DataFile.from_args(
        _table_format_version=FORMAT_VERSION,
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=positions.num_rows,
        file_size_in_bytes=table.io.new_input(location).__len__(),
        lower_bounds={DELETE_PATH_FIELD_ID: first.encode()},
        upper_bounds={DELETE_PATH_FIELD_ID: last.encode()},
        spec_id=table.metadata.default_spec_id,
    )


def stage_row_delta(
    table: Table,
    adds: Sequence[str],
    changed_keys: pyarrow.Table,
    properties: dict[str, str],
    delete_file_name: str,
    added_columns: Sequence[Column] = (),
) -> int:
    """Stage one snapshot that applies a batch of row changes: every live row whose key is in
    `changed_keys` (updated, or deleted, by the batch) is deleted by position, and the Parquet
    files `adds` (each changed key's new row, none for a deleted key) are added; `added_columns`
    (new at the source) join the schema in the same commit. Its ID. The positions are found on
    the snapshot the commit builds on, so the caller holds the table's row locked."""
    with _Transaction(table) as transaction:
        if added_columns:
            with transaction.update_schema() as schema:
                for column in added_columns:
                    schema.add_column(column.name, iceberg_type(column.type))
        metadata = transaction.table_metadata
        live = live_data_files(table)
        positions = positions_of(table, changed_keys, live.values())
        added = data_files(_as_of(table, metadata), adds)
        deletes = (
            [write_position_deletes(table, positions, delete_file_name)]
            if positions.num_rows
            else []
        )
        producer = _RowDelta(
            operation=Operation.OVERWRITE if deletes else Operation.APPEND,
            transaction=transaction,
            io=table.io,
            snapshot_properties=properties,
        )
        with producer:
            for file in added:
                producer.append_data_file(file)
            producer.added_deletes.extend(deletes)
        return producer.snapshot_id


def _as_of(table: Table, metadata: TableMetadata) -> Table:
    """`table` with the metadata a transaction has staged so far (a schema it just evolved)."""
    return Table(
        identifier=table.name(),
        metadata=metadata,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )


# JavaScript's largest exact integer. pyiceberg draws snapshot IDs from 63 bits, which JSON
# readers in JavaScript (the Temporal UI showing a procedure's result) round: a snapshot ID
# copied from there named no snapshot. Iceberg allows any positive long.
JSON_SAFE_SNAPSHOT_IDS = 2**53 - 1


def json_safe_snapshot_id(metadata: TableMetadata) -> int:
    """A new snapshot ID for the table, random in 1..2^53-1 and not in use."""
    while True:
        snapshot_id = secrets.randbelow(JSON_SAFE_SNAPSHOT_IDS) + 1
        if metadata.snapshot_by_id(snapshot_id) is None:
            return snapshot_id


class _DeleteManifestWriter(ManifestWriterV2):
    """A format-v2 manifest of delete files (pyiceberg writes only data manifests)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _RowDelta(_MergeAppendFiles):
    """Iceberg's RowDelta, which pyiceberg lacks: an append of data files that also adds
    position-delete files, in a manifest of their own (data manifests are merged as Iceberg
    merges them, so a table's manifests stay few however many commits it takes). With no
    delete files, pyiceberg's merge append. Its snapshot ID is JSON-safe."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshot_id = json_safe_snapshot_id(self._transaction.table_metadata)
        self.added_deletes: list[IcebergDataFile] = []

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        if not self.added_deletes:
            return manifests
        with _DeleteManifestWriter(
            spec=self._transaction.table_metadata.spec(),
            schema=self.schema(),
            output_file=self.new_manifest_output(),
            snapshot_id=self._snapshot_id,
            avro_compression=self._compression,
        ) as writer:
            for file in self.added_deletes:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=file,
                    )
                )
        return [writer.to_manifest_file(), *manifests]

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # The summary counts what `_added_data_files` holds, delete files by their content.
        data = self._added_data_files
        self._added_data_files = [*data, *self.added_deletes]
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._added_data_files = data


# ---- reading: snapshots, their files, their rows ----


@dataclass(frozen=True)
class PlannedFile:
    """A live data file of a snapshot: its URI, partition (as Hive names it), rows (before
    deletes), bytes, and the position-delete files that apply to it."""

    uri: str
    partition: dict[str, str]
    records: int
    bytes: int
    deletes: list[str]


def chosen_snapshot(table: Table, snapshot_id: int | None) -> Snapshot | None:
    """The snapshot asked for (None: the current one, None if the table has no data yet);
    InvalidRequest naming the snapshots kept when it is not one of them."""
    if snapshot_id is None:
        return table.current_snapshot()
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        kept = sorted(s.snapshot_id for s in table.snapshots())
        raise InvalidRequest(
            f"table {'.'.join(table.name())} has no snapshot {snapshot_id}: it never had one, or "
            f"it expired (PROCBUS_SNAPSHOT_RETENTION_SECONDS); kept: "
            f"{', '.join(map(str, kept)) or 'none'}"
        )
    return snapshot


def planned_files(table: Table, snapshot: Snapshot | None) -> list[PlannedFile]:
    """A snapshot's live data files as a scan plans them, in the order they were committed."""
    if snapshot is None:
        return []
    spec_fields = {spec.spec_id: spec.fields for spec in table.specs().values()}
    schema = table.schema()
    planned = []
    for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
        file = task.file
        partition = {
            field.name: field.transform.to_human_string(
                schema.find_field(field.source_id).field_type, file.partition[place]
            )
            for place, field in enumerate(spec_fields.get(file.spec_id, ()))
        }
        planned.append(
            PlannedFile(
                uri=file.file_path,
                partition=partition,
                records=file.record_count,
                bytes=file.file_size_in_bytes,
                deletes=sorted(delete.file_path for delete in task.delete_files),
            )
        )
    return planned


def read_rows(table: Table, snapshot: Snapshot | None, limit: int | None) -> pyarrow.Table:
    """A snapshot's rows as any Iceberg reader sees them (position deletes applied)."""
    schema = table.schema().as_arrow()
    if snapshot is None:
        return schema.empty_table()
    try:
        return table.scan(snapshot_id=snapshot.snapshot_id, limit=limit).to_arrow()
    except FileNotFoundError as gone:
        raise InvalidRequest(
            f"snapshot {snapshot.snapshot_id} of {'.'.join(table.name())} lists a file that is "
            f"gone ({gone.filename or gone}): it expired, or a compaction replaced and deleted "
            "it; read a later snapshot"
        ) from None


def snapshots_newest_first(table: Table) -> list[SnapshotSummary]:
    listed = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0, reverse=True)
    return [
        SnapshotSummary(
            snapshot_id=snapshot.snapshot_id,
            parent_id=snapshot.parent_snapshot_id,
            operation=snapshot.summary.operation.value if snapshot.summary else "",
            properties=dict(snapshot.summary.additional_properties) if snapshot.summary else {},
            committed_at=datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC),
        )
        for snapshot in listed
    ]


def referenced_files(table: Table, snapshot: Snapshot | None = None) -> set[str]:
    """Every data and delete file a snapshot (the current one by default) lists."""
    snapshot = snapshot or table.current_snapshot()
    if snapshot is None:
        return set()
    return {
        entry.data_file.file_path
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def kept_files(table: Table) -> set[str]:
    """Every data and delete file that some snapshot the table keeps lists: time travel reads
    them, so they stay until their snapshots expire."""
    manifests = {
        manifest.manifest_path: manifest
        for snapshot in table.snapshots()
        for manifest in snapshot.manifests(table.io)
    }
    return {
        entry.data_file.file_path
        for manifest in manifests.values()
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    }


# ---- retention: snapshot expiry ----


@dataclass(frozen=True)
class ExpiryPlan:
    """The snapshots to expire, and the files (data, deletes, manifests, manifest lists) that
    only they list: deleted with them."""

    expired: list[int]
    doomed: list[str]


def plan_expiry(table: Table, older_than: datetime) -> ExpiryPlan:
    """Keep the current snapshot and every snapshot replaced after `older_than` (so a reader
    that began on it just before it was replaced still finds its files); the older ones go."""
    lineage = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
    cutoff_ms = older_than.timestamp() * 1000
    keep_from = len(lineage) - 1
    for place, snapshot in enumerate(lineage):
        if snapshot.timestamp_ms >= cutoff_ms:
            keep_from = max(place - 1, 0)
            break
    expired, kept = lineage[:keep_from], lineage[keep_from:]
    if not expired:
        return ExpiryPlan([], [])
    return ExpiryPlan(
        expired=[snapshot.snapshot_id for snapshot in expired],
        doomed=sorted(_listed_by(table, expired) - _listed_by(table, kept)),
    )


def _listed_by(table: Table, snapshots: Iterable[Snapshot]) -> set[str]:
    listed: set[str] = set()
    for snapshot in snapshots:
        listed.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            listed.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                listed.add(entry.data_file.file_path)
    return listed


def plan_orphans(table: Table, folder: Path, older_than: datetime) -> list[str]:
    """The table's orphan files (Iceberg's remove-orphan-files), as sorted `file:` URIs: files
    under its data and metadata folders written or moved there (mtime, ctime) before
    `older_than` that nothing the table keeps lists: no snapshot (its manifest list, manifests,
    data and delete files), no entry of its metadata log, no statistics file (an engine with
    Iceberg's runtime may write them). A younger file may belong to a commit still in flight."""
    listed = {
        local_path(uri).resolve()
        for uri in (
            _listed_by(table, table.snapshots())
            | {table.metadata_location}
            | {log.metadata_file for log in table.metadata.metadata_log}
            | {stats.statistics_path for stats in table.metadata.statistics}
            | {stats.statistics_path for stats in table.metadata.partition_statistics}
        )
    }
    cutoff = older_than.timestamp()
    orphans = []
    for part in (DATA_FOLDER, METADATA_FOLDER):
        for path in (folder / part).rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            written = path.stat()
            if max(written.st_mtime, written.st_ctime) < cutoff and path.resolve() not in listed:
                orphans.append(file_uri(path))
    return sorted(orphans)


def stage_expiry(table: Table, snapshot_ids: Sequence[int]) -> list[int]:
    """Stage the removal of those of these snapshots the table still has; their IDs."""
    present = [snapshot_id for snapshot_id in snapshot_ids if table.snapshot_by_id(snapshot_id)]
    current = table.current_snapshot()
    present = [s for s in present if current is None or s != current.snapshot_id]
    if present:
        table.maintenance.expire_snapshots().by_ids(present).commit()
    return present


class _Rewrite(_OverwriteFiles):
    """An overwrite that also drops the delete files `dropped_deletes` (those that named only
    rows of the files it removes), rewriting their manifests with them marked deleted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshot_id = json_safe_snapshot_id(self._transaction.table_metadata)
        self.dropped_deletes: list[IcebergDataFile] = []

    def _existing_manifests(self) -> list[ManifestFile]:
        manifests = super()._existing_manifests()
        dropped = {file.file_path for file in self.dropped_deletes}
        if not dropped:
            return manifests
        kept = []
        for manifest in manifests:
            entries = (
                manifest.fetch_manifest_entry(self._io, discard_deleted=True)
                if manifest.content == ManifestContent.DELETES
                else []
            )
            if not any(entry.data_file.file_path in dropped for entry in entries):
                kept.append(manifest)
                continue
            with _DeleteManifestWriter(
                spec=self.spec(manifest.partition_spec_id),
                schema=self.schema(),
                output_file=self.new_manifest_output(),
                snapshot_id=self._snapshot_id,
                avro_compression=self._compression,
            ) as writer:
                for entry in entries:
                    gone = entry.data_file.file_path in dropped
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.DELETED
                            if gone
                            else ManifestEntryStatus.EXISTING,
                            snapshot_id=self._snapshot_id if gone else entry.snapshot_id,
                            sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number,
                            data_file=entry.data_file,
                        )
                    )
            kept.append(writer.to_manifest_file())
        return kept

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # The summary counts what `_deleted_data_files` holds, delete files by their content.
        removed = self._deleted_data_files
        self._deleted_data_files = {*removed, *self.dropped_deletes}
        try:
            return super()._summary(snapshot_properties)
        finally:
            self._deleted_data_files = removed

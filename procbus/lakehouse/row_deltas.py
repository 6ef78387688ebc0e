"""Row-level changes, merge-on-read: a batch's changed keys are found by position in the live
data files, written as a position-delete file, and committed with the batch's new rows in one
snapshot (Iceberg's RowDelta). Synchronous file I/O: callers run it in a thread."""

from __future__ import annotations

import os
import uuid
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from procbus.errors import needs_extra
from procbus.lakehouse.file_commits import data_files
from procbus.lakehouse.key_index import KEY_INDEX
from procbus.lakehouse.pyiceberg_private import RowDelta, StagingTransaction, data_file_record
from procbus.lakehouse.schemas import Column
from procbus.lakehouse.snapshot_reads import live_data_files
from procbus.lakehouse.table_metadata import (
    DELETE_PATH_FIELD_ID,
    DELETE_POS_FIELD_ID,
    FORMAT_VERSION,
    iceberg_type,
)

with needs_extra("lake"):
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.types import PrimitiveType

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.manifest import DataFile as IcebergDataFile


def position_delete_schema() -> pyarrow.Schema:
    with needs_extra("lake"):
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
    with needs_extra("lake"):
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
    with needs_extra("lake"):
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
    with needs_extra("lake"):
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
    with needs_extra("lake"):
        import pyarrow.parquet as parquet
        from pyiceberg.manifest import FileFormat
        from pyiceberg.typedef import Record

    location = table.location_provider().new_data_location(name)
    with table.io.new_output(location).create(overwrite=False) as stream:
        parquet.write_table(positions, stream)
    paths = positions.column("file_path")
    first, last = paths[0].as_py(), paths[-1].as_py()  # sorted by path
    return data_file_record(
        FORMAT_VERSION,
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
    with StagingTransaction(table) as transaction:
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
        producer = RowDelta(
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


def new_uuid() -> str:
    return uuid.uuid4().hex

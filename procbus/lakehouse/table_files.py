"""What a lake table's files on disk say, for the catalog (procbus.lakehouse.catalog): its Iceberg
table at the metadata its catalog row points at, its columns as that schema has them now, a
snapshot's data files as paths in the table's folder, its snapshots, the files they list.

pyiceberg loads only when one of these reads a table's files (a worker or a command that only
reads catalog rows starts without it); the reads are synchronous file I/O, run in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from procbus.errors import InvalidRequest
from procbus.lakehouse import naming, warehouse
from procbus.lakehouse.data import DataFile, Snapshot, TableFiles
from procbus.lakehouse.models import TableDescriptor

if TYPE_CHECKING:
    from pyiceberg.table import Table


def iceberg_table(table: TableDescriptor) -> Table:
    """The table's Iceberg table, at the metadata its catalog row points at; InvalidRequest for
    a row that points outside its folder."""
    from procbus.lakehouse import table_metadata  # pyiceberg: only where files are read

    return table_metadata.load_table(
        table_metadata.StagingCatalog(),
        table.namespace,
        table.name,
        table.metadata_location,
        Path(table.location),
    )


def with_iceberg_columns(table: TableDescriptor, loaded: Table | None = None) -> TableDescriptor:
    """`table` with the columns of its current Iceberg schema, which another engine may have
    evolved (`loaded`: the table's Iceberg table, when read already). As recorded when its
    metadata cannot be read (a catalog row broken or forged): what reads the table says why."""
    if loaded is None:
        if not table.metadata_location or not table.location:
            return table
        try:
            loaded = iceberg_table(table)
        except (InvalidRequest, OSError, ValueError):
            return table
    from procbus.lakehouse import table_metadata  # pyiceberg: only where files are read

    columns = table_metadata.schema_columns(loaded.schema())
    return table if columns == table.columns else table.model_copy(update={"columns": columns})


def snapshot_files(table: TableDescriptor, snapshot_id: int | None) -> TableFiles:
    """One snapshot of the table whole (None: the current one), its files as paths in the
    table's folder."""
    from procbus.lakehouse import snapshot_reads  # pyiceberg: only where files are read

    folder = Path(table.location)
    loaded = iceberg_table(table)
    snapshot = snapshot_reads.chosen_snapshot(loaded, snapshot_id)
    return TableFiles(
        table=with_iceberg_columns(table, loaded),
        snapshot_id=None if snapshot is None else snapshot.snapshot_id,
        files=[
            DataFile(
                path=warehouse.path_in(folder, file.uri),
                partition=file.partition,
                records=file.records,
                bytes=file.bytes,
                deletes=file.deletes,
            )
            for file in snapshot_reads.planned_files(loaded, snapshot)
        ],
        metadata_location=table.metadata_location,
    )


def columns_left_out(table: TableDescriptor) -> list[str]:
    """The columns of the table's Iceberg schema of types procbus has none for, as
    `name (type)`."""
    from procbus.lakehouse import table_metadata  # pyiceberg: only where files are read

    return table_metadata.columns_left_out(iceberg_table(table).schema())


def snapshots(table: TableDescriptor) -> list[Snapshot]:
    """The table's Iceberg snapshots, newest first."""
    from procbus.lakehouse import snapshot_reads  # pyiceberg: only where files are read

    listed = snapshot_reads.snapshots_newest_first(iceberg_table(table))
    return [_snapshot(found) for found in listed]


def _snapshot(found: naming.SnapshotSummary) -> Snapshot:
    return Snapshot(
        snapshot_id=found.snapshot_id,
        parent_id=found.parent_id,
        operation=found.properties.get(naming.OPERATION_PROPERTY, found.operation),
        job_key=found.properties.get(naming.JOB_KEY_PROPERTY, ""),
        procedure_id=found.properties.get(naming.PROCEDURE_PROPERTY, ""),
        files_added=int(found.properties.get("added-data-files", 0)),
        files_removed=int(found.properties.get("deleted-data-files", 0)),
        records_added=int(found.properties.get("added-records", 0)),
        records_removed=int(found.properties.get("deleted-records", 0)),
        committed_at=found.committed_at,
    )


def listed_files(table: TableDescriptor) -> set[str]:
    """Every file (data and delete files, as paths in the table's folder) that a snapshot the
    table keeps lists."""
    from procbus.lakehouse import snapshot_reads  # pyiceberg: only where files are read

    folder = Path(table.location)
    kept = snapshot_reads.kept_files(iceberg_table(table))
    return {warehouse.path_in(folder, uri) for uri in kept}


def file_uris(table: TableDescriptor, files: Sequence[DataFile]) -> list[str]:
    """The files (paths in the table's folder) as the `file:` URIs its Iceberg metadata lists."""
    folder = Path(table.location)
    return [warehouse.uri_in(folder, file.path) for file in files]


def is_own_metadata(table: TableDescriptor, metadata_location: str) -> bool:
    """Whether the metadata file lies in the table's own metadata folder (another engine's
    table of that name has its own)."""
    own_metadata = warehouse.file_uri(Path(table.location) / naming.METADATA_FOLDER)
    return metadata_location.startswith(f"{own_metadata}/")

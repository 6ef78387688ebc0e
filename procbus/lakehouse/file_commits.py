"""Commits that add and remove whole files: an append of Parquet files, or a compaction that
replaces live data files (committed as 'replace', which incremental readers skip), refused when
its inputs changed since it planned. Synchronous file I/O: callers run it in a thread."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from procbus.errors import InvalidRequest, SnapshotConflict, needs_extra
from procbus.lakehouse.pyiceberg_private import Rewrite, RowDelta, StagingTransaction
from procbus.lakehouse.snapshot_reads import live_data_files
from procbus.lakehouse.table_metadata import DELETE_PATH_FIELD_ID, StagingCatalog

with needs_extra("lake"):
    from pyiceberg.manifest import ManifestContent
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Operation, Snapshot

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergDataFile


def data_files(table: Table, paths: Iterable[str]) -> list[IcebergDataFile]:
    """Iceberg's record of Parquet files written for `table` (from their footers: rows, sizes,
    column bounds, partition); InvalidRequest for a file that does not fit the schema."""
    with needs_extra("lake"):
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
    with needs_extra("lake"):
        from pyiceberg.exceptions import ValidationException

    staging = table.catalog
    assert isinstance(staging, StagingCatalog)
    added = data_files(table, adds)
    with StagingTransaction(table) as transaction:
        if not removes:
            # A merge append (no delete files): pyiceberg's own, with a JSON-safe snapshot ID.
            append = RowDelta(
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
            rewrite = Rewrite(
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
    with needs_extra("lake"):
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

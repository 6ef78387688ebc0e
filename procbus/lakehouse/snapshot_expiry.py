"""Retention of a lake table's files: which snapshots expire and which files only they list
(deleted with them), the table's orphan files, and the staged removal of expired snapshots.
Synchronous file I/O: callers run it in a thread."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from procbus.errors import needs_extra
from procbus.lakehouse.naming import METADATA_FOLDER
from procbus.lakehouse.warehouse import DATA_FOLDER, file_uri, local_path

with needs_extra("lake"):
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


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

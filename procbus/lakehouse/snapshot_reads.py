"""Reading a lake table's Iceberg snapshots: which one, its live data files (with the
position-delete files that apply to each), its rows, its summary, and every file the snapshots a
table keeps list. Synchronous file I/O: callers run it in a thread."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from procbus.errors import InvalidRequest, needs_extra
from procbus.lakehouse.naming import SnapshotSummary

with needs_extra("lake"):
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntry, ManifestFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.manifest import DataFile as IcebergDataFile


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


def summary_of(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot's summary as plain values: its operation and its properties."""
    summary = snapshot.summary
    if summary is None:
        return {}
    return {"operation": summary.operation.value, **summary.additional_properties}

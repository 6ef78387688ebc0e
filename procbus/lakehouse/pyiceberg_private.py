"""Every use procbus makes of pyiceberg's private API, in one place (as pyiceberg keeps its own
snapshot producers together in `table/update/snapshot.py`): a faster staged-metadata build, the
next metadata file's version, and the snapshot producers pyiceberg lacks (a row delta with
position-delete files, a rewrite that drops delete files). Nothing else in procbus touches a
pyiceberg name that starts with `_`.

PRIVATE_USES lists what of pyiceberg this module relies on; tests/unit/test_pyiceberg_private.py
checks each against the installed pyiceberg, so an upgrade that changes one fails there, by name.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from procbus.errors import needs_extra

with needs_extra("lake"):
    from pyiceberg.catalog import MetastoreCatalog
    from pyiceberg.manifest import (
        DataFile,
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
        ManifestFile,
        ManifestWriterV2,
    )
    from pyiceberg.table import Transaction
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.snapshots import Summary
    from pyiceberg.table.update import (
        TableUpdate,
        _apply_table_update,
        _TableMetadataUpdateContext,
        _update_table_metadata_log,
    )
    from pyiceberg.table.update.snapshot import _MergeAppendFiles, _OverwriteFiles
    from pyiceberg.typedef import EMPTY_DICT, TableVersion
    from pyiceberg.utils.datetime import datetime_to_millis


@dataclass(frozen=True)
class PrivateUse:
    """A private pyiceberg name this module uses: `name` on `owner` (a module or a class; with a
    `kind`, an attribute each instance of the class holds, of that type), the `parameters` it
    is passed or overridden with, and the `attributes` used on it."""

    owner: str
    name: str
    parameters: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    kind: type | None = None

    @property
    def qualified(self) -> str:
        return f"{self.owner}.{self.name}"


_UPDATE = "pyiceberg.table.update"
_SNAPSHOT = "pyiceberg.table.update.snapshot"
_PRODUCING = ("operation", "transaction", "io", "snapshot_properties")
_APPEND = f"{_SNAPSHOT}._MergeAppendFiles"
_OVERWRITE = f"{_SNAPSHOT}._OverwriteFiles"
PRIVATE_USES: tuple[PrivateUse, ...] = (
    PrivateUse(_UPDATE, "_TableMetadataUpdateContext", attributes=("has_changes",)),
    PrivateUse(_UPDATE, "_apply_table_update", ("update", "base_metadata", "context")),
    PrivateUse(
        _UPDATE,
        "_update_table_metadata_log",
        ("base_metadata", "metadata_location", "last_updated_ms"),
    ),
    PrivateUse(
        "pyiceberg.catalog.MetastoreCatalog", "_parse_metadata_version", ("metadata_location",)
    ),
    # StagingTransaction keeps what it built while these two are the same objects.
    PrivateUse("pyiceberg.table.Transaction", "_table", kind=object),
    PrivateUse("pyiceberg.table.Transaction", "_updates", kind=tuple),
    PrivateUse("pyiceberg.manifest.ManifestWriterV2", "_meta"),
    PrivateUse("pyiceberg.manifest.DataFile", "from_args", ("_table_format_version",)),
    PrivateUse(
        _SNAPSHOT,
        "_MergeAppendFiles",
        _PRODUCING,
        ("append_data_file", "schema", "new_manifest_output", "snapshot_id"),
    ),
    PrivateUse(
        _SNAPSHOT,
        "_OverwriteFiles",
        _PRODUCING,
        ("append_data_file", "delete_data_file", "schema", "spec", "new_manifest_output"),
    ),
    PrivateUse(_APPEND, "_manifests"),
    PrivateUse(_APPEND, "_summary", ("snapshot_properties",)),
    PrivateUse(_APPEND, "_transaction", kind=object),
    PrivateUse(_APPEND, "_snapshot_id", kind=int),
    PrivateUse(_APPEND, "_compression", kind=str),
    PrivateUse(_APPEND, "_added_data_files", kind=list),
    PrivateUse(_OVERWRITE, "_existing_manifests"),
    PrivateUse(_OVERWRITE, "_summary", ("snapshot_properties",)),
    PrivateUse(_OVERWRITE, "_transaction", kind=object),
    PrivateUse(_OVERWRITE, "_snapshot_id", kind=int),
    PrivateUse(_OVERWRITE, "_compression", kind=str),
    PrivateUse(_OVERWRITE, "_io", kind=object),
    PrivateUse(_OVERWRITE, "_deleted_data_files", kind=set),
)


def updated_metadata(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """pyiceberg's update_table_metadata without its last step, a deep copy of the whole
    metadata (every snapshot in it): its models are frozen and each update builds new ones, so
    the copy guards nothing, and it was most of a pipeline commit's time once the table had
    some hundred snapshots."""
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


def next_metadata_version(metadata_location: str) -> int:
    """The version of the metadata file that follows the one at `metadata_location`."""
    return MetastoreCatalog._parse_metadata_version(metadata_location) + 1


class StagingTransaction(Transaction):
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


def data_file_record(format_version: TableVersion, **fields: Any) -> DataFile:
    """Iceberg's record of a data or delete file, with these fields, in a table of that format
    version."""
    return DataFile.from_args(_table_format_version=format_version, **fields)


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


class DeleteManifestWriter(ManifestWriterV2):
    """A format-v2 manifest of delete files (pyiceberg writes only data manifests)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class RowDelta(_MergeAppendFiles):
    """Iceberg's RowDelta, which pyiceberg lacks: an append of data files that also adds
    position-delete files, in a manifest of their own (data manifests are merged as Iceberg
    merges them, so a table's manifests stay few however many commits it takes). With no
    delete files, pyiceberg's merge append. Its snapshot ID is JSON-safe."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshot_id = json_safe_snapshot_id(self._transaction.table_metadata)
        self.added_deletes: list[DataFile] = []

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()
        if not self.added_deletes:
            return manifests
        with DeleteManifestWriter(
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


class Rewrite(_OverwriteFiles):
    """An overwrite that also drops the delete files `dropped_deletes` (those that named only
    rows of the files it removes), rewriting their manifests with them marked deleted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._snapshot_id = json_safe_snapshot_id(self._transaction.table_metadata)
        self.dropped_deletes: list[DataFile] = []

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
            with DeleteManifestWriter(
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

"""Lake tables as Apache Iceberg tables, in one import: the names of the modules that hold them
(procbus's code imports those). table_metadata: schema, first metadata file, StagingCatalog,
loading a table from its catalog row; file_commits: appends and compactions; row_deltas:
row-level changes with position deletes; snapshot_reads: snapshots, their files, their rows;
snapshot_expiry: retention; pyiceberg_private: every use of pyiceberg's private API."""

from procbus.errors import needs_extra
from procbus.lakehouse.file_commits import data_files, stage_commit
from procbus.lakehouse.naming import (
    CATALOG_NAME,
    JOB_KEY_PROPERTY,
    METADATA_FOLDER,
    OPERATION_PROPERTY,
    PROCEDURE_PROPERTY,
    SnapshotSummary,
    snapshot_properties,
)
from procbus.lakehouse.pyiceberg_private import (
    JSON_SAFE_SNAPSHOT_IDS,
    json_safe_snapshot_id,
    updated_metadata,
)
from procbus.lakehouse.row_deltas import (
    KEY_READ_THREADS,
    new_uuid,
    position_delete_schema,
    positions_of,
    stage_row_delta,
    write_position_deletes,
)
from procbus.lakehouse.snapshot_expiry import ExpiryPlan, plan_expiry, plan_orphans, stage_expiry
from procbus.lakehouse.snapshot_reads import (
    MANIFESTS_KEPT,
    PlannedFile,
    chosen_snapshot,
    kept_files,
    live_data_files,
    manifest_entries,
    planned_files,
    read_rows,
    referenced_files,
    snapshots_newest_first,
    summary_of,
)
from procbus.lakehouse.table_metadata import (
    DELETE_PATH_FIELD_ID,
    DELETE_POS_FIELD_ID,
    FIRST_PARTITION_FIELD_ID,
    FORMAT_VERSION,
    MANIFESTS_BEFORE_MERGE,
    METADATA_KEPT,
    TABLE_IDENTITY,
    PendingCommit,
    StagingCatalog,
    catalog_type,
    columns_left_out,
    iceberg_type,
    load_table,
    new_table,
    partition_spec,
    schema_columns,
    table_schema,
)
from procbus.lakehouse.warehouse import file_uri, local_path, path_in, uri_in

with needs_extra("lake"):
    from pyiceberg.table import Table

__all__ = [
    "CATALOG_NAME",
    "DELETE_PATH_FIELD_ID",
    "DELETE_POS_FIELD_ID",
    "FIRST_PARTITION_FIELD_ID",
    "FORMAT_VERSION",
    "JOB_KEY_PROPERTY",
    "JSON_SAFE_SNAPSHOT_IDS",
    "KEY_READ_THREADS",
    "MANIFESTS_BEFORE_MERGE",
    "MANIFESTS_KEPT",
    "METADATA_FOLDER",
    "METADATA_KEPT",
    "OPERATION_PROPERTY",
    "PROCEDURE_PROPERTY",
    "TABLE_IDENTITY",
    "ExpiryPlan",
    "PendingCommit",
    "PlannedFile",
    "SnapshotSummary",
    "StagingCatalog",
    "Table",
    "catalog_type",
    "chosen_snapshot",
    "columns_left_out",
    "data_files",
    "file_uri",
    "iceberg_type",
    "json_safe_snapshot_id",
    "kept_files",
    "live_data_files",
    "load_table",
    "local_path",
    "manifest_entries",
    "new_table",
    "new_uuid",
    "partition_spec",
    "path_in",
    "plan_expiry",
    "plan_orphans",
    "planned_files",
    "position_delete_schema",
    "positions_of",
    "read_rows",
    "referenced_files",
    "schema_columns",
    "snapshot_properties",
    "snapshots_newest_first",
    "stage_commit",
    "stage_expiry",
    "stage_row_delta",
    "summary_of",
    "table_schema",
    "updated_metadata",
    "uri_in",
    "write_position_deletes",
]

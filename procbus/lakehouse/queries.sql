-- name: get_namespace
SELECT "name", "properties", "created_by", "created_at"
FROM "procbus_namespaces" WHERE "name" = $1;

-- name: list_namespaces
SELECT "name", "properties", "created_by", "created_at"
FROM "procbus_namespaces" ORDER BY "name";

-- name: insert_namespace
-- A retried step finds its own row; a row of another procedure makes the insert return nothing.
INSERT INTO "procbus_namespaces" ("name", "properties", "created_by")
VALUES ($1, $2, $3)
ON CONFLICT ("name") DO UPDATE SET "name" = EXCLUDED."name"
    WHERE "procbus_namespaces"."created_by" = EXCLUDED."created_by"
RETURNING "name";

-- name: namespace_created_by
-- Whether the procedure's namespace is there to undo (locked until the undo commits).
SELECT true FROM "procbus_namespaces" WHERE "name" = $1 AND "created_by" = $2 FOR UPDATE;

-- name: delete_namespace_created_by
DELETE FROM "procbus_namespaces" WHERE "name" = $1 AND "created_by" = $2;

-- name: delete_empty_namespace
-- Refused (no row) while the namespace holds tables.
DELETE FROM "procbus_namespaces" AS n
WHERE n."name" = $1
  AND NOT EXISTS (SELECT 1 FROM "procbus_tables" AS t WHERE t."namespace" = n."name")
RETURNING n."name";

-- name: restore_namespace
INSERT INTO "procbus_namespaces" ("name", "properties", "created_by", "created_at")
VALUES ($1, $2, $3, $4)
ON CONFLICT ("name") DO NOTHING;

-- name: count_tables_in_namespace
SELECT count(*) FROM "procbus_tables" WHERE "namespace" = $1;

-- name: get_table
SELECT "namespace", "name", "columns", "partition_by", "properties", "location", "created_by",
       "created_at", "key_columns"
FROM "procbus_tables" WHERE "namespace" = $1 AND "name" = $2;

-- name: list_tables
SELECT "namespace", "name", "columns", "partition_by", "properties", "location", "created_by",
       "created_at", "key_columns"
FROM "procbus_tables"
WHERE $1::text IS NULL OR "namespace" = $1
ORDER BY "namespace", "name";

-- name: insert_table
INSERT INTO "procbus_tables"
    ("namespace", "name", "columns", "partition_by", "properties", "location", "created_by")
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT ("namespace", "name") DO UPDATE SET "name" = EXCLUDED."name"
    WHERE "procbus_tables"."created_by" = EXCLUDED."created_by"
RETURNING "name";

-- name: table_created_by
-- Whether the procedure's table is there to undo (locked until the undo commits).
SELECT true FROM "procbus_tables"
WHERE "namespace" = $1 AND "name" = $2 AND "created_by" = $3 FOR UPDATE;

-- name: delete_table_created_by
DELETE FROM "procbus_tables" WHERE "namespace" = $1 AND "name" = $2 AND "created_by" = $3;

-- name: delete_table
DELETE FROM "procbus_tables" WHERE "namespace" = $1 AND "name" = $2;

-- name: restore_table
INSERT INTO "procbus_tables"
    ("namespace", "name", "columns", "partition_by", "properties", "location", "created_by",
     "created_at")
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT ("namespace", "name") DO NOTHING;

-- name: insert_event
INSERT INTO "procbus_events" ("procedure_id", "event_type", "namespace", "table_name", "payload")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT ("procedure_id", "event_type") DO NOTHING
RETURNING "id";

-- name: event_recorded
-- Whether the procedure's event is there to undo (locked until the undo commits).
SELECT true FROM "procbus_events" WHERE "procedure_id" = $1 AND "event_type" = $2 FOR UPDATE;

-- name: delete_event
DELETE FROM "procbus_events" WHERE "procedure_id" = $1 AND "event_type" = $2
RETURNING "namespace", "table_name";

-- name: list_events
SELECT "id", "procedure_id", "event_type", "namespace", "table_name", "payload", "created_at"
FROM "procbus_events" ORDER BY "id";

-- name: list_access
-- Every grant: a namespace's own ('*' for its table) before those on its tables.
SELECT "principal", "namespace", "table", "permission"
FROM (
    SELECT "principal", "namespace", '*' AS "table", "permission", 0 AS "on_table"
    FROM "procbus_namespace_acl"
    UNION ALL
    SELECT "principal", "namespace", "table_name", "permission", 1
    FROM "procbus_acl"
) AS "grants"
ORDER BY "namespace", "on_table", "table", "principal", "permission";

-- name: grant_access
INSERT INTO "procbus_acl" ("principal", "namespace", "table_name", "permission", "granted_by")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING;

-- name: grant_namespace_access
INSERT INTO "procbus_namespace_acl" ("principal", "namespace", "permission", "granted_by")
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING;

-- name: has_permission
-- The grant on the table, or the same permission on its namespace.
SELECT EXISTS (
    SELECT 1 FROM "procbus_acl"
    WHERE "principal" = $1 AND "namespace" = $2 AND "table_name" = $3 AND "permission" = $4
) OR EXISTS (
    SELECT 1 FROM "procbus_namespace_acl"
    WHERE "principal" = $1 AND "namespace" = $2 AND "permission" = $4
);

-- name: has_namespace_permission
SELECT EXISTS (
    SELECT 1 FROM "procbus_namespace_acl"
    WHERE "principal" = $1 AND "namespace" = $2 AND "permission" = $3
);

-- name: revoke_access
DELETE FROM "procbus_acl"
WHERE "principal" = $1 AND "namespace" = $2 AND "table_name" = $3 AND "permission" = $4;

-- name: revoke_namespace_access
DELETE FROM "procbus_namespace_acl"
WHERE "principal" = $1 AND "namespace" = $2 AND "permission" = $3;

-- name: current_snapshot
SELECT "current_snapshot" FROM "procbus_tables" WHERE "namespace" = $1 AND "name" = $2;

-- name: oldest_snapshot
-- The oldest snapshot kept (Retention expires older ones); NULL: none recorded.
SELECT min("snapshot_id") FROM "procbus_snapshots" WHERE "namespace" = $1 AND "table_name" = $2;

-- name: swap_snapshot
-- The compare-and-set: no row when another commit moved the table's snapshot meanwhile.
UPDATE "procbus_tables" SET "current_snapshot" = $4
WHERE "namespace" = $1 AND "name" = $2 AND "current_snapshot" IS NOT DISTINCT FROM $3
RETURNING "current_snapshot";

-- name: live_files_among
SELECT "path" FROM "procbus_table_files"
WHERE "namespace" = $1 AND "table_name" = $2 AND "path" = ANY($3::text[])
  AND "removed_in" IS NULL;

-- name: files_added_since
-- A merge-on-read table's key and how many of its live files came after snapshot $3.
SELECT t."key_columns",
       (SELECT count(*) FROM "procbus_table_files" AS f
        WHERE f."namespace" = t."namespace" AND f."table_name" = t."name"
          AND f."added_in" > $3 AND f."removed_in" IS NULL) AS "newer"
FROM "procbus_tables" AS t WHERE t."namespace" = $1 AND t."name" = $2;

-- name: insert_snapshot
INSERT INTO "procbus_snapshots"
    ("namespace", "table_name", "snapshot_id", "parent_id", "operation", "job_key",
     "procedure_id", "files_added", "files_removed", "records_added", "records_removed")
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: insert_files
INSERT INTO "procbus_table_files"
    ("namespace", "table_name", "path", "partition", "records", "bytes", "kind", "added_in")
SELECT $1, $2, file."path", file."partition", file."records", file."bytes", file."kind", $3
FROM jsonb_to_recordset($4::jsonb)
    AS file("path" text, "partition" jsonb, "records" bigint, "bytes" bigint, "kind" text);

-- name: remove_files
UPDATE "procbus_table_files" SET "removed_in" = $3
WHERE "namespace" = $1 AND "table_name" = $2 AND "path" = ANY($4::text[]);

-- name: files_in_snapshot
-- In commit order: a merge-on-read reader takes each key's row from the newest file.
SELECT "path", "partition", "records", "bytes", "kind", "added_in" FROM "procbus_table_files"
WHERE "namespace" = $1 AND "table_name" = $2
  AND "added_in" <= $3 AND ("removed_in" IS NULL OR "removed_in" > $3)
ORDER BY "added_in", "path";

-- name: set_key_columns
-- A table's merge key, set by its first change apply; the same key after that, or no row.
UPDATE "procbus_tables" SET "key_columns" = $3
WHERE "namespace" = $1 AND "name" = $2 AND ("key_columns" = '{}' OR "key_columns" = $3)
RETURNING "name";

-- name: add_columns
-- Columns added to a table, by compare-and-set of the columns the caller planned on: no row
-- when they changed meanwhile. The row stays locked until commit.
UPDATE "procbus_tables" SET "columns" = $4::jsonb
WHERE "namespace" = $1 AND "name" = $2 AND "columns" = $3::jsonb
RETURNING "name";

-- name: list_snapshots
SELECT "snapshot_id", "parent_id", "operation", "job_key", "procedure_id", "files_added",
       "files_removed", "records_added", "records_removed", "committed_at"
FROM "procbus_snapshots" WHERE "namespace" = $1 AND "table_name" = $2
ORDER BY "snapshot_id" DESC;

-- ---- the Iceberg SQL catalog (procbus.lakehouse.commits); $1 is always the catalog name ----

-- name: iceberg_add_namespace_property
INSERT INTO "iceberg_namespace_properties"
    ("catalog_name", "namespace", "property_key", "property_value")
VALUES ($1, $2, $3, $4)
ON CONFLICT ("catalog_name", "namespace", "property_key")
    DO UPDATE SET "property_value" = EXCLUDED."property_value";

-- name: iceberg_drop_namespace
DELETE FROM "iceberg_namespace_properties" WHERE "catalog_name" = $1 AND "namespace" = $2;

-- name: iceberg_add_table
-- No row when a table of that name is there already.
INSERT INTO "iceberg_tables"
    ("catalog_name", "table_namespace", "table_name", "metadata_location",
     "previous_metadata_location", "iceberg_type")
VALUES ($1, $2, $3, $4, NULL, 'TABLE')
ON CONFLICT DO NOTHING
RETURNING "metadata_location";

-- name: iceberg_drop_table
DELETE FROM "iceberg_tables"
WHERE "catalog_name" = $1 AND "table_namespace" = $2 AND "table_name" = $3
RETURNING "metadata_location";

-- name: iceberg_table_location
SELECT "metadata_location" FROM "iceberg_tables"
WHERE "catalog_name" = $1 AND "table_namespace" = $2 AND "table_name" = $3;

-- name: iceberg_lock_table
-- The table's row, locked until the caller's transaction ends: no other commit moves it before.
SELECT "metadata_location" FROM "iceberg_tables"
WHERE "catalog_name" = $1 AND "table_namespace" = $2 AND "table_name" = $3
FOR UPDATE;

-- name: iceberg_swap
-- The compare-and-set of Iceberg's SQL catalogs: no row when another commit moved the pointer.
UPDATE "iceberg_tables"
SET "metadata_location" = $5, "previous_metadata_location" = $4
WHERE "catalog_name" = $1 AND "table_namespace" = $2 AND "table_name" = $3
  AND "metadata_location" = $4
RETURNING "table_name";

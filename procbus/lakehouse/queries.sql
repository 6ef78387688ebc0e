-- name: get_namespace
SELECT "name", "properties", "created_by", "created_run", "created_at"
FROM "procbus_namespaces" WHERE "name" = $1;

-- name: list_namespaces
SELECT "name", "properties", "created_by", "created_run", "created_at"
FROM "procbus_namespaces" ORDER BY "name";

-- name: insert_namespace
-- A retried step finds its own row; a row of another procedure, or of an earlier run under the
-- same workflow ID, makes the insert return nothing.
INSERT INTO "procbus_namespaces" ("name", "properties", "created_by", "created_run")
VALUES ($1, $2, $3, $4)
ON CONFLICT ("name") DO UPDATE SET "name" = EXCLUDED."name"
    WHERE "procbus_namespaces"."created_by" = EXCLUDED."created_by"
      AND "procbus_namespaces"."created_run" = EXCLUDED."created_run"
RETURNING "name";

-- name: namespace_created_by
-- Whether the procedure's namespace is there to undo (locked until the undo commits).
SELECT true FROM "procbus_namespaces"
WHERE "name" = $1 AND "created_by" = $2 AND "created_run" = $3 FOR UPDATE;

-- name: delete_namespace_created_by
DELETE FROM "procbus_namespaces" WHERE "name" = $1 AND "created_by" = $2 AND "created_run" = $3;

-- name: delete_empty_namespace
-- Refused (no row) while the namespace holds tables.
DELETE FROM "procbus_namespaces" AS n
WHERE n."name" = $1
  AND NOT EXISTS (SELECT 1 FROM "procbus_tables" AS t WHERE t."namespace" = n."name")
RETURNING n."name";

-- name: restore_namespace
INSERT INTO "procbus_namespaces" ("name", "properties", "created_by", "created_run", "created_at")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT ("name") DO NOTHING;

-- name: count_tables_in_namespace
-- procbus's, and those another engine made in the Iceberg catalog ($2: its name).
SELECT count(*) FROM (
    SELECT "name" FROM "procbus_tables" WHERE "namespace" = $1
    UNION
    SELECT "table_name" FROM "iceberg_tables" WHERE "catalog_name" = $2 AND "table_namespace" = $1
) AS "tables";

-- name: get_table
-- With its current Iceberg metadata ($3: the Iceberg catalog's name).
SELECT t."namespace", t."name", t."columns", t."partition_by", t."properties", t."location",
       t."created_by", t."created_run", t."created_at", t."key_columns", i."metadata_location"
FROM "procbus_tables" AS t
LEFT JOIN "iceberg_tables" AS i
    ON i."catalog_name" = $3 AND i."table_namespace" = t."namespace" AND i."table_name" = t."name"
WHERE t."namespace" = $1 AND t."name" = $2;

-- name: list_tables
SELECT t."namespace", t."name", t."columns", t."partition_by", t."properties", t."location",
       t."created_by", t."created_run", t."created_at", t."key_columns", i."metadata_location"
FROM "procbus_tables" AS t
LEFT JOIN "iceberg_tables" AS i
    ON i."catalog_name" = $2 AND i."table_namespace" = t."namespace" AND i."table_name" = t."name"
WHERE $1::text IS NULL OR t."namespace" = $1
ORDER BY t."namespace", t."name";

-- name: insert_table
-- As insert_namespace: only the same procedure's same run finds its row.
INSERT INTO "procbus_tables"
    ("namespace", "name", "columns", "partition_by", "properties", "location", "created_by",
     "created_run")
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT ("namespace", "name") DO UPDATE SET "name" = EXCLUDED."name"
    WHERE "procbus_tables"."created_by" = EXCLUDED."created_by"
      AND "procbus_tables"."created_run" = EXCLUDED."created_run"
RETURNING "name";

-- name: table_created_by
-- Whether the procedure's table is there to undo (locked until the undo commits).
SELECT true FROM "procbus_tables"
WHERE "namespace" = $1 AND "name" = $2 AND "created_by" = $3 AND "created_run" = $4 FOR UPDATE;

-- name: delete_table_created_by
DELETE FROM "procbus_tables"
WHERE "namespace" = $1 AND "name" = $2 AND "created_by" = $3 AND "created_run" = $4;

-- name: delete_table
DELETE FROM "procbus_tables" WHERE "namespace" = $1 AND "name" = $2;

-- name: restore_table
INSERT INTO "procbus_tables"
    ("namespace", "name", "columns", "partition_by", "properties", "location", "created_by",
     "created_run", "created_at")
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT ("namespace", "name") DO NOTHING;

-- name: insert_event
INSERT INTO "procbus_events"
    ("procedure_id", "procedure_run", "event_type", "namespace", "table_name", "payload")
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT ("procedure_id", "procedure_run", "event_type") DO NOTHING
RETURNING "id";

-- name: event_recorded
-- Whether the procedure's event is there to undo (locked until the undo commits).
SELECT true FROM "procbus_events"
WHERE "procedure_id" = $1 AND "procedure_run" = $2 AND "event_type" = $3 FOR UPDATE;

-- name: delete_event
DELETE FROM "procbus_events"
WHERE "procedure_id" = $1 AND "procedure_run" = $2 AND "event_type" = $3
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

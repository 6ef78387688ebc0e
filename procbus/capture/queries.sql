-- Change capture: which application tables publish their row changes, into which topic.

-- name: source_table
-- The table a name resolves to (through the search_path when unqualified), or no row.
SELECT c."oid", n."nspname" AS "schema", c."relname" AS "name", c."relkind"::text AS "kind"
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n."oid" = c."relnamespace"
WHERE c."oid" = to_regclass($1);

-- name: table_columns
SELECT a."attname" AS "name"
FROM pg_catalog.pg_attribute AS a
WHERE a."attrelid" = $1::oid AND a."attnum" > 0 AND NOT a."attisdropped"
ORDER BY a."attnum";

-- name: column_definitions
-- A table's columns as they are now (none when it is gone): type, NOT NULL, default.
SELECT a."attname" AS "name", format_type(a."atttypid", NULL) AS "base_type",
       format_type(a."atttypid", a."atttypmod") AS "type", a."attnotnull" AS "not_null",
       a."atthasdef" AS "has_default"
FROM pg_catalog.pg_attribute AS a
WHERE a."attrelid" = to_regclass(format('%I.%I', $1::text, $2::text))
  AND a."attnum" > 0 AND NOT a."attisdropped"
ORDER BY a."attnum";

-- name: captured_columns
-- The source's columns when its capture into the topic began (NULL: not kept then).
SELECT "source_columns" FROM "procbus_captures"
WHERE "topic" = $1 AND "source_schema" = $2 AND "source_table" = $3;

-- name: primary_key
SELECT a."attname" AS "name"
FROM pg_catalog.pg_index AS i
CROSS JOIN LATERAL unnest(i."indkey") WITH ORDINALITY AS k("attnum", "place")
JOIN pg_catalog.pg_attribute AS a ON a."attrelid" = i."indrelid" AND a."attnum" = k."attnum"
WHERE i."indrelid" = $1::oid AND i."indisprimary"
ORDER BY k."place";

-- name: topic_for_capture
SELECT "sync", "group_transactions", "endpoint" FROM "procbus_topics" WHERE "name" = $1;

-- name: insert_capture
INSERT INTO "procbus_captures"
    ("source_schema", "source_table", "topic", "key_columns", "trigger_name", "source_columns")
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
RETURNING "created_at";

-- name: grant_pipeline_write
-- The pipeline's own principal may write the lake table its changes go to (when it exists: a
-- grant names a catalog table). True: granted now or before (a grant already there is left
-- untouched: no row is written).
WITH "granted" AS (
    INSERT INTO "procbus_acl" ("principal", "namespace", "table_name", "permission", "granted_by")
    SELECT $1, t."namespace", t."name", 'write', $4
    FROM "procbus_tables" AS t WHERE t."namespace" = $2 AND t."name" = $3
    ON CONFLICT ("principal", "namespace", "table_name", "permission") DO NOTHING
    RETURNING true
)
SELECT true FROM "granted"
UNION ALL
SELECT true FROM "procbus_acl" AS a
WHERE a."principal" = $1 AND a."namespace" = $2 AND a."table_name" = $3 AND a."permission" = 'write'
LIMIT 1;

-- name: attach
SELECT "procbus_capture_attach"($1::oid::regclass, $2, $3::text[], $4);

-- name: detach
SELECT "procbus_capture_detach"($1, $2, $3);

-- name: record_snapshot
UPDATE "procbus_captures" SET "snapshot_rows" = $4
WHERE "source_schema" = $1 AND "source_table" = $2 AND "topic" = $3;

-- name: list_captures
SELECT "source_schema", "source_table", "topic", "key_columns", "trigger_name",
       "snapshot_rows", "created_at"
FROM "procbus_captures"
WHERE $1::text IS NULL OR "topic" = $1
ORDER BY "topic", "source_schema", "source_table";

-- name: delete_capture
DELETE FROM "procbus_captures"
WHERE "source_schema" = $1 AND "source_table" = $2 AND "topic" = $3
RETURNING "trigger_name";

-- name: take_migration_lock
-- Two `procbus db migrate` at once: the second waits here, then finds nothing left to apply.
SELECT pg_advisory_xact_lock(hashtext('procbus.migrate'));

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS "procbus_schema_migrations" (
    "version" integer PRIMARY KEY,
    "name" text NOT NULL,
    "checksum" text NOT NULL,
    "applied_at" timestamptz NOT NULL DEFAULT now()
);

-- name: create_functions_table
-- The functions files applied, each with the checksum of its text as it was applied last.
CREATE TABLE IF NOT EXISTS "procbus_schema_functions" (
    "file" text PRIMARY KEY,
    "checksum" text NOT NULL,
    "applied_at" timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
SELECT "version", "name", "checksum", "applied_at"
FROM "procbus_schema_migrations"
ORDER BY "version";

-- name: record_migration
INSERT INTO "procbus_schema_migrations" ("version", "name", "checksum") VALUES ($1, $2, $3);

-- name: applied_functions
SELECT "file", "checksum", "applied_at" FROM "procbus_schema_functions" ORDER BY "file";

-- name: record_functions
INSERT INTO "procbus_schema_functions" ("file", "checksum") VALUES ($1, $2)
ON CONFLICT ("file") DO UPDATE SET "checksum" = excluded."checksum", "applied_at" = now();

-- The nemesis's instruments (procbus.testing.nemesis): not part of procbus's schema.

-- name: install_lock_log
-- Every change of a row of procbus's lock table, as it happens (clock_timestamp): the locks
-- checker replays it to find incompatible grants that overlapped.
CREATE TABLE IF NOT EXISTS "nemesis_lock_log" (
    "seq" bigserial PRIMARY KEY,
    "at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "op" text NOT NULL,
    "resource" text NOT NULL,
    "holder" text NOT NULL,
    "mode" text NOT NULL,
    "family" text[] NOT NULL,
    "token" bigint,
    "lease_expires_at" timestamptz NOT NULL
);
CREATE OR REPLACE FUNCTION "nemesis_log_lock"() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    "changed" "procbus_locks" := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
BEGIN
    INSERT INTO "nemesis_lock_log"
        ("op", "resource", "holder", "mode", "family", "token", "lease_expires_at")
    VALUES (TG_OP, "changed"."resource", "changed"."holder", "changed"."mode",
            "changed"."family", "changed"."token", "changed"."lease_expires_at");
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS "nemesis_log_lock" ON "procbus_locks";
CREATE TRIGGER "nemesis_log_lock" AFTER INSERT OR UPDATE OR DELETE ON "procbus_locks"
FOR EACH ROW EXECUTE FUNCTION "nemesis_log_lock"();

-- name: lock_log
SELECT "seq", "at", "op", "resource", "holder", "mode", "family", "token", "lease_expires_at"
FROM "nemesis_lock_log" ORDER BY "seq";

-- name: install_catalog_log
-- Every row written to the catalog (namespaces, tables, grants, catalog events), as it happens,
-- with the fence its transaction carried (procbus.fence, noted by check_fence) or, for a change
-- pipeline's commit, the batch it applied (procbus.batch): the fencing checker replays it
-- beside the lock log.
CREATE TABLE IF NOT EXISTS "nemesis_catalog_log" (
    "seq" bigserial PRIMARY KEY,
    "at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "relation" text NOT NULL,
    "op" text NOT NULL,
    "row" jsonb NOT NULL,
    "fence" text,
    "batch" text
);
CREATE OR REPLACE FUNCTION "nemesis_log_catalog"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "nemesis_catalog_log" ("relation", "op", "row", "fence", "batch")
    VALUES (TG_TABLE_NAME, TG_OP,
            to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END),
            nullif(current_setting('procbus.fence', true), ''),
            nullif(current_setting('procbus.batch', true), ''));
    RETURN NULL;
END $$;
DO $$
DECLARE
    "relation" text;
BEGIN
    FOREACH "relation" IN ARRAY ARRAY['procbus_namespaces', 'procbus_namespace_acl',
                                      'procbus_tables', 'procbus_acl', 'procbus_events']
    LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS "nemesis_log_catalog" ON %I', "relation");
        EXECUTE format('CREATE TRIGGER "nemesis_log_catalog" AFTER INSERT OR UPDATE OR DELETE '
                       'ON %I FOR EACH ROW EXECUTE FUNCTION "nemesis_log_catalog"()', "relation");
    END LOOP;
END $$;

-- name: catalog_log
SELECT "seq", "at", "relation", "op", "row"::text AS "row", "fence", "batch"
FROM "nemesis_catalog_log" ORDER BY "seq";

-- name: catalog_events
-- The catalog events left at the end: one per procedure that succeeded, none of one undone.
SELECT "procedure_id", "event_type" FROM "procbus_events" ORDER BY "id";

-- name: install_snapshot_log
-- Every snapshot committed to a lake table, kept when its table is deleted (its snapshots go
-- with it): the Spark checker counts each job's commits.
CREATE TABLE IF NOT EXISTS "nemesis_snapshot_log" (
    "seq" bigserial PRIMARY KEY,
    "at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "snapshot_id" bigint NOT NULL,
    "operation" text NOT NULL,
    "job_key" text NOT NULL,
    "procedure_id" text NOT NULL
);
CREATE OR REPLACE FUNCTION "nemesis_log_snapshot"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "nemesis_snapshot_log"
        ("namespace", "table_name", "snapshot_id", "operation", "job_key", "procedure_id")
    VALUES (NEW."namespace", NEW."table_name", NEW."snapshot_id", NEW."operation",
            NEW."job_key", NEW."procedure_id");
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS "nemesis_log_snapshot" ON "procbus_snapshots";
CREATE TRIGGER "nemesis_log_snapshot" AFTER INSERT ON "procbus_snapshots"
FOR EACH ROW EXECUTE FUNCTION "nemesis_log_snapshot"();

-- name: snapshot_log
SELECT "seq", "at", "namespace", "table_name", "snapshot_id", "operation", "job_key",
       "procedure_id"
FROM "nemesis_snapshot_log" ORDER BY "seq";

-- name: spark_jobs
-- Each Spark job's ledger row at the end: none may be left running or staged.
SELECT "job_key", "procedure_id", "namespace", "table_name", "attempt", "state"
FROM "procbus_spark_jobs" ORDER BY "job_key";

-- name: live_table_files
-- Each lake table's folder and the files its current snapshot lists (none: a NULL path).
SELECT t."namespace", t."name", t."location", f."path"
FROM "procbus_tables" t
LEFT JOIN "procbus_table_files" f
  ON f."namespace" = t."namespace" AND f."table_name" = t."name" AND f."removed_in" IS NULL
ORDER BY t."namespace", t."name", f."path";

-- name: install_bank
-- The application's bank: accounts whose changes a capture publishes to a change pipeline.
CREATE TABLE IF NOT EXISTS "nemesis_accounts" (
    "id" bigint PRIMARY KEY,
    "owner" text NOT NULL,
    "balance" bigint NOT NULL
);

-- name: open_bank_accounts
INSERT INTO "nemesis_accounts" ("id", "owner", "balance")
SELECT n, 'owner-' || n, $1::bigint FROM generate_series(1, $2::int) AS n;

-- name: move_money
UPDATE "nemesis_accounts" SET "balance" = "balance" + $2 WHERE "id" = $1;

-- name: bank_accounts
SELECT "id", "owner", "balance" FROM "nemesis_accounts" ORDER BY "id";

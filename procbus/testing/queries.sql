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
-- Every commit to a lake table (a move of its Iceberg catalog row), kept when its table is
-- deleted, with the job or change batch that its transaction committed: the Spark checker
-- counts each job's commits. Expiries (retention) move the row with no job.
CREATE TABLE IF NOT EXISTS "nemesis_snapshot_log" (
    "seq" bigserial PRIMARY KEY,
    "at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "metadata_location" text NOT NULL,
    "txid" bigint NOT NULL DEFAULT txid_current()
);
CREATE TABLE IF NOT EXISTS "nemesis_commit_log" (
    "txid" bigint NOT NULL DEFAULT txid_current(),
    "job_key" text NOT NULL,
    "procedure_id" text NOT NULL
);
CREATE OR REPLACE FUNCTION "nemesis_log_snapshot"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "nemesis_snapshot_log" ("namespace", "table_name", "metadata_location")
    VALUES (NEW."table_namespace", NEW."table_name", NEW."metadata_location");
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS "nemesis_log_snapshot" ON "iceberg_tables";
CREATE TRIGGER "nemesis_log_snapshot" AFTER UPDATE OF "metadata_location" ON "iceberg_tables"
FOR EACH ROW EXECUTE FUNCTION "nemesis_log_snapshot"();
CREATE OR REPLACE FUNCTION "nemesis_log_job_commit"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "nemesis_commit_log" ("job_key", "procedure_id")
    VALUES (NEW."job_key", NEW."procedure_id");
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS "nemesis_log_job_commit" ON "procbus_spark_jobs";
CREATE TRIGGER "nemesis_log_job_commit" AFTER UPDATE OF "state" ON "procbus_spark_jobs"
FOR EACH ROW WHEN (NEW."state" = 'committed' AND OLD."state" <> 'committed')
EXECUTE FUNCTION "nemesis_log_job_commit"();
CREATE OR REPLACE FUNCTION "nemesis_log_batch_commit"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "nemesis_commit_log" ("job_key", "procedure_id")
    VALUES (NEW."batch_id", 'pipeline:' || NEW."topic");
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS "nemesis_log_batch_commit" ON "procbus_pipeline_batches";
CREATE TRIGGER "nemesis_log_batch_commit" AFTER INSERT ON "procbus_pipeline_batches"
FOR EACH ROW EXECUTE FUNCTION "nemesis_log_batch_commit"();

-- name: snapshot_log
-- Each commit with the job or batch of its transaction (none: an expiry's).
SELECT s."seq", s."at", s."namespace", s."table_name", s."seq" AS "snapshot_id",
       coalesce(c."job_key", '') AS "job_key", coalesce(c."procedure_id", '') AS "procedure_id"
FROM "nemesis_snapshot_log" AS s
LEFT JOIN "nemesis_commit_log" AS c ON c."txid" = s."txid"
ORDER BY s."seq";

-- name: spark_jobs
-- Each Spark job's ledger row at the end: none may be left running or staged.
SELECT "job_key", "procedure_id", "namespace", "table_name", "attempt", "state"
FROM "procbus_spark_jobs" ORDER BY "job_key";

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

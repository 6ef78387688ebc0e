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
-- with the fence its transaction carried (procbus.fence, noted by check_fence): the fencing
-- checker replays it beside the lock log.
CREATE TABLE IF NOT EXISTS "nemesis_catalog_log" (
    "seq" bigserial PRIMARY KEY,
    "at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "relation" text NOT NULL,
    "op" text NOT NULL,
    "row" jsonb NOT NULL,
    "fence" text
);
CREATE OR REPLACE FUNCTION "nemesis_log_catalog"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "nemesis_catalog_log" ("relation", "op", "row", "fence")
    VALUES (TG_TABLE_NAME, TG_OP,
            to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END),
            nullif(current_setting('procbus.fence', true), ''));
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
SELECT "seq", "at", "relation", "op", "row"::text AS "row", "fence"
FROM "nemesis_catalog_log" ORDER BY "seq";

-- name: catalog_events
-- The catalog events left at the end: one per procedure that succeeded, none of one undone.
SELECT "procedure_id", "event_type" FROM "procbus_events" ORDER BY "id";

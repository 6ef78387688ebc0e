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

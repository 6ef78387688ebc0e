-- Executions whose locks were released: a late request of theirs is refused, not granted anew.
-- A worker paused while a workflow task was handed to it runs that stale task when it resumes,
-- and with it the procedure's first `acquire_locks`, after the procedure had ended and
-- released; without this row the locks of a finished procedure came back and blocked every
-- other procedure on those resources until their lease ran out. An execution is a procedure's
-- run chain (Temporal's first execution run ID): a later procedure under the same workflow ID
-- is another execution. Rows older than a week go (procbus/locks/table.py).
CREATE TABLE "procbus_lock_releases" (
    "holder" text NOT NULL,
    "execution" text NOT NULL,
    "released_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY ("holder", "execution")
);
CREATE INDEX "procbus_lock_releases_released_at" ON "procbus_lock_releases" ("released_at");

-- Both take the execution now (procbus/locks/functions.sql makes them anew; a new database
-- has neither yet).
DROP FUNCTION IF EXISTS "procbus_lock_acquire"(text, text[], text[], text[], double precision);
DROP FUNCTION IF EXISTS "procbus_lock_release"(text);

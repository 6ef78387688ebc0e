-- A procedure's locks name its execution (its first run ID), so a waiter that finds them held by
-- a workflow that has closed (terminated, timed out) can tell, ask Temporal, and release them
-- instead of waiting out their lease. Other holders (LockTable.holding) name none.
ALTER TABLE "procbus_locks" ADD COLUMN "execution" text;

-- Every release of locks by someone other than their holder: by procbus for a holder whose
-- workflow closed, or by an operator (`procbus lock release HOLDER`). Kept: it is the audit.
CREATE TABLE "procbus_lock_audit" (
    "id" bigserial PRIMARY KEY,
    "holder" text NOT NULL,
    "execution" text,
    "resources" text[] NOT NULL,
    "released_by" text NOT NULL,
    "reason" text NOT NULL,
    "released_at" timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: acquire_locks
SELECT "resource", "mode", "token", "lease_expires_at", "blockers", "woken"
FROM "procbus_lock_acquire"($1, $2, $3, $4, $5, $6);

-- name: release_locks
SELECT "procbus_lock_release" AS "woken" FROM "procbus_lock_release"($1, $2);

-- name: forget_lock_releases
-- Long after its end no worker still holds an old workflow task of the execution.
DELETE FROM "procbus_lock_releases" WHERE "released_at" < now() - make_interval(secs => $1);

-- name: renew_locks
-- Only granted locks: a waiting request renews its place by asking again (acquire_locks).
UPDATE "procbus_locks" SET "lease_expires_at" = clock_timestamp() + make_interval(secs => $2)
WHERE "holder" = $1 AND "token" IS NOT NULL
RETURNING "resource", "token", "lease_expires_at";

-- name: check_fence
-- The fence's grants that are still held, with their resources' newest tokens. FOR SHARE: an
-- expiry or a new grant on these resources waits until the fenced write has committed.
SELECT l."resource", r."last_token"
FROM "procbus_locks" AS l
JOIN "procbus_lock_resources" AS r ON r."resource" = l."resource"
WHERE (l."resource", l."token") IN (
    SELECT f."resource", f."token" FROM unnest($1::text[], $2::bigint[]) AS f("resource", "token")
)
FOR SHARE;

-- name: note_fence
-- The fence a write carries, for the rest of its transaction: an audit trigger reads it as
-- current_setting('procbus.fence', true) (docs/concepts/locks.md; the nemesis's fencing checker).
SELECT set_config('procbus.fence', $1, true);

-- name: list_locks
SELECT "resource", "mode", "holder", "token", "queue_position", "requested_at", "granted_at",
       "lease_expires_at", "lease_expires_at" < clock_timestamp() AS "expired"
FROM "procbus_locks"
WHERE $1::text IS NULL OR "holder" = $1
ORDER BY "resource", "token" IS NULL, "queue_position";

-- name: database_time
SELECT clock_timestamp();

-- name: holder_executions
-- The executions a holder's locks name (none for a holder that is no procedure).
SELECT DISTINCT "execution" FROM "procbus_locks"
WHERE "holder" = $1 AND "execution" IS NOT NULL;

-- name: holder_resources
SELECT "resource" FROM "procbus_locks" WHERE "holder" = $1 ORDER BY "resource" FOR UPDATE;

-- name: audit_release
INSERT INTO "procbus_lock_audit" ("holder", "execution", "resources", "released_by", "reason")
VALUES ($1, $2, $3, $4, $5)
RETURNING "id";

-- name: list_lock_audit
SELECT "id", "holder", "execution", "resources", "released_by", "reason", "released_at"
FROM "procbus_lock_audit" ORDER BY "id";

-- name: held_grants
-- Who holds each of these (resource, token) grants now, and in which mode.
SELECT l."resource", l."token", l."holder", l."mode"
FROM "procbus_locks" AS l
WHERE (l."resource", l."token") IN (
    SELECT g."resource", g."token" FROM unnest($1::text[], $2::bigint[]) AS g("resource", "token")
);

-- name: acquire_locks
SELECT "resource", "mode", "token", "lease_expires_at", "blockers", "woken"
FROM "procbus_lock_acquire"($1, $2, $3, $4, $5);

-- name: release_locks
SELECT "procbus_lock_release" AS "woken" FROM "procbus_lock_release"($1);

-- name: renew_locks
-- Only granted locks: a waiting request renews its place by asking again (acquire_locks).
UPDATE "procbus_locks" SET "lease_expires_at" = clock_timestamp() + make_interval(secs => $2)
WHERE "holder" = $1 AND "token" IS NOT NULL
RETURNING "resource", "token", "lease_expires_at";

-- name: check_fence
-- FOR SHARE: a new grant on the resource waits until the fenced write has committed.
SELECT "last_token" FROM "procbus_lock_resources" WHERE "resource" = $1 FOR SHARE;

-- name: list_locks
SELECT "resource", "mode", "holder", "token", "queue_position", "requested_at", "granted_at",
       "lease_expires_at", "lease_expires_at" < clock_timestamp() AS "expired"
FROM "procbus_locks"
WHERE $1::text IS NULL OR "holder" = $1
ORDER BY "resource", "token" IS NULL, "queue_position";

-- name: join
-- A member that restarts under the same ID takes its row over.
INSERT INTO "procbus_bus_members"
    ("member_id", "task_queue", "host", "pid", "timeout_seconds")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT ("member_id") DO UPDATE SET
    "task_queue" = EXCLUDED."task_queue",
    "host" = EXCLUDED."host",
    "pid" = EXCLUDED."pid",
    "timeout_seconds" = EXCLUDED."timeout_seconds",
    "started_at" = now(),
    "heartbeat_at" = now()
RETURNING "started_at";

-- name: heartbeat
-- Only the process that joined may keep the row alive (a restart under the same ID replaced it).
UPDATE "procbus_bus_members" SET "heartbeat_at" = now()
WHERE "member_id" = $1 AND "pid" = $2 AND "host" = $3
RETURNING "member_id";

-- name: leave
DELETE FROM "procbus_bus_members" WHERE "member_id" = $1 AND "pid" = $2 AND "host" = $3;

-- name: list_members
SELECT "member_id", "task_queue", "host", "pid", "started_at", "heartbeat_at",
       "timeout_seconds",
       "heartbeat_at" + make_interval(secs => "timeout_seconds") > now() AS "live"
FROM "procbus_bus_members"
ORDER BY "member_id";

-- name: forget_long_gone
-- Rows of members gone for ten of their timeouts: nobody will send to them again.
DELETE FROM "procbus_bus_members"
WHERE "heartbeat_at" + make_interval(secs => 10 * "timeout_seconds") < now();

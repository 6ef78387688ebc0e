-- name: join
-- A process joining under a member ID takes its row over with a new incarnation (from the
-- sequence: never one handed out before); the process that held it finds that at its next
-- heartbeat and stops serving. Returns how long that process may still act on its last heartbeat
-- (its lease: $6 of its timeout), so the new one waits that out before it serves; 0 when the row
-- was free or its holder's lease had run out. A row another join made in the same instant (not
-- in this statement's snapshot) counts as renewed now.
WITH "before" AS (
    SELECT "heartbeat_at", "timeout_seconds" FROM "procbus_bus_members"
    WHERE "member_id" = $1
    FOR UPDATE
), "joined" AS (
    INSERT INTO "procbus_bus_members"
        ("member_id", "task_queue", "host", "pid", "timeout_seconds")
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT ("member_id") DO UPDATE SET
        "task_queue" = EXCLUDED."task_queue",
        "host" = EXCLUDED."host",
        "pid" = EXCLUDED."pid",
        "timeout_seconds" = EXCLUDED."timeout_seconds",
        "started_at" = now(),
        "heartbeat_at" = now(),
        "incarnation" = nextval('"procbus_bus_incarnations"')
    RETURNING "started_at", "incarnation", "xmax"::text <> '0' AS "replaced"
)
SELECT j."started_at", j."incarnation",
       CASE WHEN j."replaced" THEN greatest(0, extract(epoch FROM
           coalesce(b."heartbeat_at", now())
           + make_interval(secs => coalesce(b."timeout_seconds", $5) * $6) - now()
       ))::double precision ELSE 0 END AS "predecessor_lease_seconds"
FROM "joined" AS j LEFT JOIN "before" AS b ON true;

-- name: heartbeat
-- Only the incarnation that joined may keep the row alive: nothing comes back once another
-- process took the ID over. A row forgotten meanwhile (gone ten timeouts) is made again.
INSERT INTO "procbus_bus_members" AS m
    ("member_id", "task_queue", "host", "pid", "timeout_seconds", "incarnation")
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT ("member_id") DO UPDATE SET "heartbeat_at" = now()
WHERE m."incarnation" = EXCLUDED."incarnation"
RETURNING "incarnation";

-- name: holder
SELECT "host", "pid", "incarnation" FROM "procbus_bus_members" WHERE "member_id" = $1;

-- name: leave
DELETE FROM "procbus_bus_members" WHERE "member_id" = $1 AND "incarnation" = $2;

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

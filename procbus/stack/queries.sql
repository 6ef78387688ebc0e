-- name: insert_stack_check
-- A retried activity finds its own row instead of writing a second one.
INSERT INTO "procbus_stack_checks" ("check_id", "message", "worker")
VALUES ($1, $2, $3)
ON CONFLICT ("check_id") DO NOTHING;

-- name: get_stack_check
SELECT "id", "check_id", "message", "worker", "written_at"
FROM "procbus_stack_checks"
WHERE "check_id" = $1;

-- name: count_stack_checks
SELECT count(*) FROM "procbus_stack_checks";

-- name: set_superuser_password
-- Run by the single-user server before the first start: a utility statement takes no
-- parameters, so {password} is filled in (procbus's own URL-safe token, checked as such).
ALTER ROLE "postgres" PASSWORD '{password}';

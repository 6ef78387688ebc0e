-- name: begin_attempt
-- A new attempt token fences out every earlier attempt; a committed job takes no new one.
INSERT INTO "procbus_spark_jobs"
    ("job_key", "procedure_id", "namespace", "table_name", "attempt", "attempt_token", "state")
VALUES ($1, $2, $3, $4, 1, $5, 'running')
ON CONFLICT ("job_key") DO UPDATE
    SET "attempt" = "procbus_spark_jobs"."attempt" + 1,
        "attempt_token" = EXCLUDED."attempt_token",
        "state" = 'running',
        "error" = NULL,
        "updated_at" = now()
    WHERE "procbus_spark_jobs"."state" <> 'committed'
RETURNING "attempt";

-- name: insert_attempt
INSERT INTO "procbus_spark_attempts" ("job_key", "attempt", "attempt_token", "worker")
VALUES ($1, $2, $3, $4);

-- name: get_job
SELECT "job_key", "procedure_id", "namespace", "table_name", "attempt", "attempt_token",
       "state", "snapshot_id", "error", "started_at", "updated_at"
FROM "procbus_spark_jobs" WHERE "job_key" = $1;

-- name: lock_job
SELECT "attempt", "attempt_token", "state", "snapshot_id"
FROM "procbus_spark_jobs" WHERE "job_key" = $1 FOR UPDATE;

-- name: set_state
-- Only the current attempt moves its job, and never out of 'committed'.
UPDATE "procbus_spark_jobs" SET "state" = $3, "error" = $4, "updated_at" = now()
WHERE "job_key" = $1 AND "attempt_token" = $2 AND "state" <> 'committed'
RETURNING "state";

-- name: end_job
-- The job is given up (its procedure rolls back): whatever attempt runs is fenced out.
UPDATE "procbus_spark_jobs" SET "state" = $2, "error" = $3, "updated_at" = now()
WHERE "job_key" = $1 AND "state" <> 'committed';

-- name: mark_committed
UPDATE "procbus_spark_jobs"
SET "state" = 'committed', "snapshot_id" = $2, "error" = NULL, "updated_at" = now()
WHERE "job_key" = $1;

-- name: attempt_tokens
SELECT "attempt", "attempt_token" FROM "procbus_spark_attempts"
WHERE "job_key" = $1 ORDER BY "attempt";

-- name: set_submission
UPDATE "procbus_spark_attempts" SET "submission_id" = $3, "output" = $4
WHERE "job_key" = $1 AND "attempt_token" = $2;

-- name: current_submission
-- The running attempt's cluster submission, if it has one.
SELECT a."attempt_token", a."submission_id", a."output"
FROM "procbus_spark_jobs" AS j
JOIN "procbus_spark_attempts" AS a
  ON a."job_key" = j."job_key" AND a."attempt_token" = j."attempt_token"
WHERE j."job_key" = $1 AND j."state" = 'running' AND a."submission_id" IS NOT NULL;

-- Retention: rows that would otherwise only grow, deleted by age in bounded batches ($n: LIMIT).

-- name: delete_done_outbox_rows
-- Outbox rows performed (or refused) longer ago than $1 seconds: history, nothing reads them.
WITH "gone" AS (
    DELETE FROM "procbus_outbox"
    WHERE "id" IN (
        SELECT "id" FROM "procbus_outbox"
        WHERE "done_at" < now() - make_interval(secs => $1)
        ORDER BY "id"
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM "gone";

-- name: finished_spark_jobs
-- Jobs that ended longer ago than $1 seconds, after job key $2 (keyset pages: a page whose
-- procedures still run is passed over, not read again).
SELECT "job_key", "procedure_id" FROM "procbus_spark_jobs"
WHERE "state" IN ('committed', 'failed', 'cancelled')
  AND "updated_at" < now() - make_interval(secs => $1)
  AND "job_key" > $2
ORDER BY "job_key"
LIMIT $3;

-- name: delete_spark_jobs
-- Their attempts go with them (ON DELETE CASCADE); a job begun again since its listing stays.
WITH "gone" AS (
    DELETE FROM "procbus_spark_jobs"
    WHERE "job_key" = ANY ($1::text[])
      AND "state" IN ('committed', 'failed', 'cancelled')
      AND "updated_at" < now() - make_interval(secs => $2)
    RETURNING 1
)
SELECT count(*) FROM "gone";

-- name: delete_applied_batch_fences
-- Fence rows of change batches applied longer ago than $1 seconds whose entries have left the
-- queue: no attempt can send those batches again (as forget_settled_batches, for every topic,
-- also those whose pipeline commits nothing any more).
WITH "gone" AS (
    DELETE FROM "procbus_pipeline_batches"
    WHERE ("topic", "batch_id") IN (
        SELECT b."topic", b."batch_id" FROM "procbus_pipeline_batches" AS b
        WHERE b."applied_at" < now() - make_interval(secs => $1)
          AND NOT EXISTS (
              SELECT FROM "procbus_topic_entries" AS e
              WHERE e."topic" = b."topic" AND e."batch_id" = b."batch_id"
          )
        LIMIT $2
        FOR UPDATE OF b SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM "gone";

-- name: delete_long_gone_members
-- Members whose heartbeat ran out (older than their own timeout) longer ago than $1 seconds.
WITH "gone" AS (
    DELETE FROM "procbus_bus_members"
    WHERE "member_id" IN (
        SELECT "member_id" FROM "procbus_bus_members"
        WHERE "heartbeat_at" + make_interval(secs => "timeout_seconds")
              < now() - make_interval(secs => $1)
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM "gone";

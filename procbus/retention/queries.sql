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

-- name: tables_to_expire
-- Tables with snapshots to expire or files no kept snapshot lists, as keep_from (below) would
-- find them: candidates only, decided again under the table's lock.
SELECT t."namespace", t."name", t."location"
FROM "procbus_tables" AS t
CROSS JOIN LATERAL (
    SELECT least(
        t."current_snapshot",
        (
            SELECT min(s."snapshot_id") - 1 FROM "procbus_snapshots" AS s
            WHERE s."namespace" = t."namespace" AND s."table_name" = t."name"
              AND s."committed_at" >= now() - make_interval(secs => $1)
        )
    ) AS "keep_from"
) AS k
WHERE k."keep_from" IS NOT NULL
  AND (
      EXISTS (
          SELECT FROM "procbus_snapshots" AS s
          WHERE s."namespace" = t."namespace" AND s."table_name" = t."name"
            AND s."snapshot_id" < k."keep_from"
      )
      OR EXISTS (
          SELECT FROM "procbus_table_files" AS f
          WHERE f."namespace" = t."namespace" AND f."table_name" = t."name"
            AND f."removed_in" <= k."keep_from"
      )
  )
ORDER BY t."namespace", t."name";

-- name: lock_table_keep_from
-- Inside an expiry's transaction: the table's row locked as a commit's compare-and-set locks it
-- (no commit lands meanwhile), and the oldest snapshot to keep: the current one, or the one
-- before the oldest snapshot committed within $3 seconds (a snapshot is kept while its
-- successor is younger than the retention, so a reader that began on it just before it was
-- replaced still finds its files). NULL: the table has no snapshot.
SELECT least(
    t."current_snapshot",
    (
        SELECT min(s."snapshot_id") - 1 FROM "procbus_snapshots" AS s
        WHERE s."namespace" = t."namespace" AND s."table_name" = t."name"
          AND s."committed_at" >= now() - make_interval(secs => $3)
    )
) AS "keep_from"
FROM "procbus_tables" AS t
WHERE t."namespace" = $1 AND t."name" = $2
FOR UPDATE OF t;

-- name: delete_snapshots_before
-- Snapshots older than the oldest one kept ($3).
WITH "gone" AS (
    DELETE FROM "procbus_snapshots"
    WHERE "namespace" = $1 AND "table_name" = $2
      AND "snapshot_id" IN (
          SELECT "snapshot_id" FROM "procbus_snapshots"
          WHERE "namespace" = $1 AND "table_name" = $2 AND "snapshot_id" < $3
          ORDER BY "snapshot_id"
          LIMIT $4
      )
    RETURNING 1
)
SELECT count(*) FROM "gone";

-- name: files_listed_by_no_kept_snapshot
-- Files removed by a commit at or before the oldest kept snapshot ($3): no kept snapshot lists
-- them (one is live in S when added_in <= S < removed_in), the current one least of all.
SELECT "path" FROM "procbus_table_files"
WHERE "namespace" = $1 AND "table_name" = $2 AND "removed_in" <= $3
ORDER BY "path"
LIMIT $4;

-- name: delete_file_rows
DELETE FROM "procbus_table_files"
WHERE "namespace" = $1 AND "table_name" = $2 AND "path" = ANY ($3::text[]) AND "removed_in" <= $4;

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

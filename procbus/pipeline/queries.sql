-- The change pipeline: where a table:// topic's changes have reached the lake.

-- name: batch_applied
SELECT EXISTS (
    SELECT FROM "procbus_pipeline_batches" WHERE "topic" = $1 AND "batch_id" = $2
);

-- name: batch_still_claimed
-- The fence of a delivery attempt: its claim is still the topic's claim, of the topic's current
-- owner epoch. The row lock keeps a new owner's take-over (which ends the claim and bumps the
-- epoch) behind this commit, or this commit behind it.
SELECT c."claim" = $2::uuid AND c."epoch" = t."owner_epoch" AS "held"
FROM "procbus_topic_claims" AS c
JOIN "procbus_topics" AS t ON t."name" = c."topic"
WHERE c."topic" = $1
FOR SHARE OF c;

-- name: ensure_pipeline
INSERT INTO "procbus_pipelines" ("topic") VALUES ($1) ON CONFLICT DO NOTHING;

-- name: record_batch
-- The fence: a second apply of the same batch waits here for the first one's commit, then
-- finds its row and commits nothing.
INSERT INTO "procbus_pipeline_batches" ("topic", "batch_id", "changes", "snapshots")
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING
RETURNING "batch_id";

-- name: record_snapshots
UPDATE "procbus_pipeline_batches" SET "snapshots" = $3 WHERE "topic" = $1 AND "batch_id" = $2;

-- name: advance
UPDATE "procbus_pipelines"
SET "position" = greatest("position", $2),
    "batches_applied" = "batches_applied" + 1,
    "changes_applied" = "changes_applied" + $3,
    "transactions_applied" = "transactions_applied" + $4,
    "source_committed_at" = greatest("source_committed_at", $5),
    "applied_at" = now(),
    "last_error" = NULL,
    "last_error_at" = NULL
WHERE "topic" = $1;

-- name: forget_settled_batches
-- Fence rows of batches settled long ago: their entries are gone from the queue, so no attempt
-- can send them again (a zombie's commit is refused by its claim).
DELETE FROM "procbus_pipeline_batches" AS b
WHERE b."topic" = $1 AND b."applied_at" < now() - make_interval(secs => $2)
  AND NOT EXISTS (
      SELECT FROM "procbus_topic_entries" AS e
      WHERE e."topic" = b."topic" AND e."batch_id" = b."batch_id"
  );

-- name: record_error
INSERT INTO "procbus_pipelines" ("topic", "last_error", "last_error_at") VALUES ($1, $2, now())
ON CONFLICT ("topic") DO UPDATE SET "last_error" = $2, "last_error_at" = now();

-- name: pipeline_status
SELECT t."name" AS "topic", t."endpoint", t."disabled_at" IS NULL AS "enabled", t."disabled_reason",
       coalesce(p."position", 0) AS "position",
       coalesce(p."batches_applied", 0) AS "batches_applied",
       coalesce(p."changes_applied", 0) AS "changes_applied",
       coalesce(p."transactions_applied", 0) AS "transactions_applied",
       p."source_committed_at", p."applied_at", p."last_error", p."last_error_at",
       q."lag_changes", q."lag_transactions", q."oldest_waiting",
       (SELECT count(*) FROM "procbus_topic_dead_letters" AS d WHERE d."topic" = t."name")
           AS "dead_letters",
       (SELECT e."batch_id" FROM "procbus_topic_entries" AS e WHERE e."topic" = t."name"
        ORDER BY e."id" LIMIT 1) AS "first_batch",
       clock_timestamp() AS "now"
FROM "procbus_topics" AS t
LEFT JOIN "procbus_pipelines" AS p ON p."topic" = t."name"
CROSS JOIN LATERAL (
    SELECT count(*) AS "lag_changes",
           count(DISTINCT coalesce(e."txn_id", e."id"::text)) AS "lag_transactions",
           min(e."created_at") AS "oldest_waiting"
    FROM "procbus_topic_entries" AS e WHERE e."topic" = t."name"
) AS q
WHERE t."name" = $1;

-- name: pipeline_progress
-- The changes applied, from the pipeline's position row alone (no pass over its queue).
SELECT t."disabled_at" IS NULL AS "enabled", t."disabled_reason",
       coalesce(p."changes_applied", 0) AS "changes_applied"
FROM "procbus_topics" AS t
LEFT JOIN "procbus_pipelines" AS p ON p."topic" = t."name"
WHERE t."name" = $1;

-- name: pipeline_may_write
-- In the commit's transaction: the pipeline's principal ($1) still holds write on the table,
-- or on its namespace.
SELECT EXISTS (
    SELECT 1 FROM "procbus_acl"
    WHERE "principal" = $1 AND "namespace" = $2 AND "table_name" = $3 AND "permission" = 'write'
) OR EXISTS (
    SELECT 1 FROM "procbus_namespace_acl"
    WHERE "principal" = $1 AND "namespace" = $2 AND "permission" = 'write'
);

-- name: note_batch
-- The batch a commit applies, for the rest of its transaction: an audit trigger reads it as
-- current_setting('procbus.batch', true) (docs/concepts/locks.md; the nemesis's fencing checker).
SELECT set_config('procbus.batch', $1, true);

-- name: insert_outbox_row
-- On the application's own connection: the payload comes as JSON text, so no codec is needed.
INSERT INTO "procbus_outbox"
    ("kind", "workflow_id", "workflow_type", "signal_name", "task_queue", "payload", "request_id")
VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7)
RETURNING "id";

-- name: claim_outbox_rows
-- Claims are leases: a relay that dies mid-call leaves rows another relay takes after expiry.
UPDATE "procbus_outbox" AS o
SET "claimed_until" = now() + make_interval(secs => $2), "attempts" = o."attempts" + 1
WHERE o."id" IN (
    SELECT "id" FROM "procbus_outbox"
    WHERE "done_at" IS NULL
      AND ("claimed_until" IS NULL OR "claimed_until" < now())
      AND ($3::bigint[] IS NULL OR "id" = ANY ($3::bigint[]))
    ORDER BY "id"
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING o."id", o."kind", o."workflow_id", o."workflow_type", o."signal_name", o."task_queue",
          o."payload", o."request_id", o."attempts";

-- name: mark_outbox_done
UPDATE "procbus_outbox" SET "done_at" = now(), "run_id" = $2, "last_error" = NULL
WHERE "id" = $1;

-- name: mark_outbox_rows_done
-- A sweep's performed rows in one statement, with their run IDs (NULL for a signal).
UPDATE "procbus_outbox" AS o SET "done_at" = now(), "run_id" = d."run_id", "last_error" = NULL
FROM unnest($1::bigint[], $2::text[]) AS d("id", "run_id")
WHERE o."id" = d."id";

-- name: mark_outbox_failed
UPDATE "procbus_outbox" SET "claimed_until" = now() + make_interval(secs => $3), "last_error" = $2
WHERE "id" = $1;

-- name: close_refused_outbox_row
-- A row that names what the outbox may not do (an internal workflow, engine state): closed, not
-- performed, its reason kept; `run_id` stays NULL.
UPDATE "procbus_outbox" SET "done_at" = now(), "last_error" = 'refused: ' || $2 WHERE "id" = $1;

-- name: count_pending_outbox
SELECT count(*) FROM "procbus_outbox" WHERE "done_at" IS NULL;

-- A topic's delivery owner has an epoch that only grows: each take-over (a new owner's first act,
-- Topics.take_over) bumps it, and an attempt of an older epoch can never claim, settle or commit
-- again. Before, a claim had no owner: a zombie attempt could claim the topic back after a
-- take-over, and on a table:// topic commit files that the new owner's sweep had removed.
--
-- The epoch lives with the topic (logged); the claim's row carries the epoch of the attempt that
-- holds it. A take-over locks the claim's row, bumps the topic's epoch and leaves the new epoch
-- in that row without a claim, so that a hold racing it finds the newer epoch there and is
-- refused in the same statement; settlements and pipeline commits check the row's epoch too.

ALTER TABLE "procbus_topics" ADD COLUMN "owner_epoch" bigint NOT NULL DEFAULT 0;

ALTER TABLE "procbus_topic_claims"
    ALTER COLUMN "claim" DROP NOT NULL,
    ADD COLUMN "epoch" bigint NOT NULL DEFAULT 0;

DROP FUNCTION "procbus_topic_hold"(text, uuid);
DROP FUNCTION "procbus_topic_view"(text, integer, uuid);
DROP FUNCTION "procbus_topic_claim"(text, integer, uuid);

-- Make "p_claim" the topic's one claim: an older one is fenced out from now on. Only an attempt
-- of the topic's current owner epoch ("p_epoch"; NULL: whatever it is now) may: an older one (a
-- zombie past its take-over) is refused with PBT04, also when it races the take-over (that
-- leaves the new epoch in the claim's row, which this then finds). PBT01: no such topic.
CREATE FUNCTION "procbus_topic_hold"("p_topic" text, "p_claim" uuid, "p_epoch" bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO "procbus_topic_claims" AS c ("topic", "claim", "epoch")
    SELECT t."name", "p_claim", t."owner_epoch" FROM "procbus_topics" AS t
    WHERE t."name" = "p_topic" AND t."owner_epoch" = coalesce("p_epoch", t."owner_epoch")
    ON CONFLICT ("topic") DO UPDATE
    SET "claim" = excluded."claim", "claimed_at" = excluded."claimed_at", "epoch" = excluded."epoch"
    WHERE c."epoch" <= excluded."epoch";
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT FROM "procbus_topics" AS t WHERE t."name" = "p_topic") THEN
            RAISE EXCEPTION 'no topic named %', "p_topic" USING ERRCODE = 'PBT01';
        END IF;
        RAISE EXCEPTION 'topic %: this delivery attempt (owner epoch %) was taken over by a newer '
            'owner; it claims nothing more', "p_topic", "p_epoch" USING ERRCODE = 'PBT04';
    END IF;
END
$$;

-- What decides a grouped topic's next batch, and the entries it is made of, in one round trip
-- (a batch assembled from it is sent as read here): the head of its queue outside
-- kept batches ("in_window", read by index probes in queue order whatever the statistics say: a
-- freshly filled queue looks tiny to the planner, which would then read all of it), and, when the
-- head is full, the rest of the transactions that start in it and end beyond it, read through the
-- transaction index (never by reading on). "blocked": the event may not go yet, because an earlier
-- event of its key waits in a kept batch, or (beyond the head) lies unread between the head's end
-- and it. On the first row only (each row's copy took a tenth of the look's time to decode): "now",
-- the look's time, and "any_kept", whether the topic has kept batches. A look that may find
-- something first makes "p_claim" the topic's claim: what it reads stays as read until another
-- attempt claims (see assign_batches in procbus/topics/queries.sql). Then batches that another
-- attempt assembled and did not settle (it died, or was fenced out) are kept on their entries:
-- they may have been sent, so each is resent exactly. (The topic's own rounds settle theirs
-- before the next.)
CREATE FUNCTION "procbus_topic_view"(
    "p_topic" text, "p_limit" integer, "p_claim" uuid, "p_epoch" bigint
)
RETURNS TABLE (
    "id" bigint,
    "key" text,
    "txn_id" text,
    "txn_last" boolean,
    "txn_size" integer,
    "created_at" timestamptz,
    "blocked" boolean,
    "in_window" boolean,
    "any_kept" boolean,
    "now" timestamptz,
    "type" text,
    "payload" jsonb,
    "bytes" bigint,
    "webhook_id" text,
    "attempts" integer,
    "last_error" text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    "kept" boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM "procbus_topic_batches" AS b WHERE b."topic" = "p_topic") THEN
        PERFORM "procbus_topic_hold"("p_topic", "p_claim", "p_epoch");
        PERFORM "procbus_topic_keep_batches"("p_topic", NULL);
    ELSIF EXISTS (
        SELECT 1 FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic" AND e."batch_id" IS NULL
    ) THEN
        PERFORM "procbus_topic_hold"("p_topic", "p_claim", "p_epoch");
    END IF;
    "kept" := EXISTS (
        SELECT 1 FROM "procbus_topic_entries" AS k
        WHERE k."topic" = "p_topic" AND k."batch_id" IS NOT NULL
    );
    RETURN QUERY
    WITH "head" AS MATERIALIZED (
        SELECT e."id", e."key", e."txn_id", e."txn_last", e."txn_size", e."created_at", e."type",
               e."payload", e."bytes", e."webhook_id", e."attempts", e."last_error"
        FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic" AND e."batch_id" IS NULL
        ORDER BY e."id"
        LIMIT "p_limit"
    ), "edge" AS MATERIALIZED (  -- once, not once per row it is joined with
        SELECT min(h."id") AS "first", max(h."id") AS "last", count(*) AS "read" FROM "head" AS h
    ), "open" AS (
        SELECT h."txn_id" FROM "head" AS h
        WHERE h."txn_id" IS NOT NULL
        GROUP BY h."txn_id"
        HAVING NOT bool_or(h."txn_last") OR count(*) < max(h."txn_size")
    ), "rest" AS (
        SELECT e."id", e."key", e."txn_id", e."txn_last", e."txn_size", e."created_at", e."type",
               e."payload", e."bytes", e."webhook_id", e."attempts", e."last_error",
               "edge"."last" AS "head_end"
        FROM "edge" CROSS JOIN "open" AS o
        -- One probe of the transaction index per open transaction. OFFSET 0 keeps the planner
        -- from joining the whole queue beyond the head instead (its generic plan did, a scan of
        -- every queued entry on every look).
        CROSS JOIN LATERAL (
            SELECT t.* FROM "procbus_topic_entries" AS t
            WHERE t."topic" = "p_topic" AND t."txn_id" = o."txn_id" AND t."id" > "edge"."last"
              AND t."batch_id" IS NULL
            OFFSET 0
        ) AS e
        WHERE "edge"."read" = "p_limit"
    )
    SELECT h."id", h."key", h."txn_id", h."txn_last", h."txn_size", h."created_at",
           ("kept" AND h."key" IS NOT NULL AND EXISTS (
               SELECT 1 FROM "procbus_topic_entries" AS p
               WHERE p."topic" = "p_topic" AND p."key" = h."key" AND p."id" < h."id"
                 AND p."batch_id" IS NOT NULL
           )),
           true, CASE WHEN h."id" = g."first" THEN "kept" END,
           CASE WHEN h."id" = g."first" THEN clock_timestamp() END, h."type", h."payload",
           h."bytes", h."webhook_id", h."attempts", h."last_error"
    FROM "head" AS h CROSS JOIN "edge" AS g
    UNION ALL
    SELECT r."id", r."key", r."txn_id", r."txn_last", r."txn_size", r."created_at",
           (r."key" IS NOT NULL AND (
               EXISTS (
                   SELECT 1 FROM "procbus_topic_entries" AS p
                   WHERE p."topic" = "p_topic" AND p."key" = r."key" AND p."id" > r."head_end"
                     AND p."id" < r."id" AND p."batch_id" IS NULL
                     AND (p."txn_id" IS NULL OR p."txn_id" NOT IN (SELECT o."txn_id" FROM "open" AS o))
               )
               OR ("kept" AND EXISTS (
                   SELECT 1 FROM "procbus_topic_entries" AS p
                   WHERE p."topic" = "p_topic" AND p."key" = r."key" AND p."id" < r."id"
                     AND p."batch_id" IS NOT NULL
               ))
           )),
           false, NULL, NULL, r."type", r."payload", r."bytes", r."webhook_id", r."attempts",
           r."last_error"
    FROM "rest" AS r
    ORDER BY 1;
END
$$;

-- A delivery attempt's batch, in queue order: entries due and not behind an earlier entry of
-- the same key that waits for its retry (only that key waits). The claim becomes the topic's
-- one claim when it holds anything (an idle topic's look writes nothing). Index probes in queue
-- order, whatever the table's statistics say: a freshly filled queue looks tiny to the planner.
CREATE FUNCTION "procbus_topic_claim"(
    "p_topic" text,
    "p_limit" integer,
    "p_claim" uuid,
    "p_epoch" bigint
) RETURNS TABLE (
    "id" bigint,
    "key" text,
    "type" text,
    "payload" jsonb,
    "bytes" bigint,
    "webhook_id" text,
    "created_at" timestamptz,
    "attempts" integer,
    "last_error" text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    "found" integer;
BEGIN
    RETURN QUERY
    SELECT e."id", e."key", e."type", e."payload", e."bytes", e."webhook_id", e."created_at",
           e."attempts", e."last_error"
    FROM "procbus_topic_entries" AS e
    WHERE e."topic" = "p_topic"
      AND e."next_attempt_at" <= clock_timestamp()
      AND (e."key" IS NULL OR NOT EXISTS (
          SELECT 1 FROM "procbus_topic_entries" AS p
          WHERE p."topic" = e."topic" AND p."key" = e."key" AND p."id" < e."id"
            AND p."next_attempt_at" > clock_timestamp()
      ))
    ORDER BY e."id"
    LIMIT "p_limit";
    GET DIAGNOSTICS "found" = ROW_COUNT;
    IF "found" > 0 THEN
        PERFORM "procbus_topic_hold"("p_topic", "p_claim", "p_epoch");
    END IF;
END
$$;

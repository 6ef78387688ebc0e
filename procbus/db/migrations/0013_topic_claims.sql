-- A topic's delivery claim is one row per topic, not a mark on every entry it holds.
--
-- A topic has one delivery owner, and its rounds go one after the other (claim, send, settle),
-- so an entry never needs to be held against another claimer: only the attempt that may settle
-- must be known. A new claim replaces the topic's row, and with it fences out any older,
-- overlapping attempt (a zombie past its timeout); settling deletes the row, first, under its
-- lock. Claiming thus writes one row instead of rewriting every entry it reads. The table is
-- unlogged: a claim is a fence between live attempts, not data, so a claim that only writes it
-- waits for no WAL flush; after a database crash it is empty, and every attempt claims again.

CREATE UNLOGGED TABLE "procbus_topic_claims" (
    "topic" text PRIMARY KEY REFERENCES "procbus_topics" ("name") ON DELETE CASCADE,
    "claim" uuid NOT NULL,
    "claimed_at" timestamptz NOT NULL DEFAULT clock_timestamp()
);

DROP FUNCTION "procbus_topic_claim"(text, integer, uuid, double precision);
DROP FUNCTION "procbus_topic_assign"(text, text[], uuid, double precision, bigint[], integer);

ALTER TABLE "procbus_topic_entries" DROP COLUMN "claim", DROP COLUMN "claimed_until";

-- A delivery attempt's batch, in queue order: entries due and not behind an earlier entry of
-- the same key that waits for its retry (only that key waits). The claim becomes the topic's
-- one claim when it holds anything (an idle topic's look writes nothing). Index probes in queue
-- order, whatever the table's statistics say: a freshly filled queue looks tiny to the planner.
CREATE FUNCTION "procbus_topic_claim"(
    "p_topic" text,
    "p_limit" integer,
    "p_claim" uuid
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
        PERFORM "procbus_topic_hold"("p_topic", "p_claim");
    END IF;
END
$$;

-- Make "p_claim" the topic's one claim: an older one is fenced out from now on.
CREATE FUNCTION "procbus_topic_hold"("p_topic" text, "p_claim" uuid) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO "procbus_topic_claims" ("topic", "claim") VALUES ("p_topic", "p_claim")
    ON CONFLICT ("topic") DO UPDATE
    SET "claim" = excluded."claim", "claimed_at" = excluded."claimed_at";
$$;

-- Keep assembled batches: each entry's batch ("p_batch_ids", parallel to "p_ids") and its place
-- in the send order, for the claim "p_claim", and count the batches that go without a
-- transaction's missing events ("p_incomplete"). All or nothing: PBB01 when an overlapping
-- attempt took some of the entries first. By primary key, whatever the statistics say.
CREATE FUNCTION "procbus_topic_assign"(
    "p_topic" text,
    "p_batch_ids" text[],
    "p_claim" uuid,
    "p_ids" bigint[],
    "p_incomplete" integer
) RETURNS TABLE (
    "id" bigint,
    "key" text,
    "type" text,
    "payload" jsonb,
    "bytes" bigint,
    "webhook_id" text,
    "created_at" timestamptz,
    "attempts" integer,
    "last_error" text,
    "txn_id" text,
    "txn_last" boolean,
    "txn_size" integer
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
AS $$
#variable_conflict use_column
DECLARE
    "taken" integer;
BEGIN
    PERFORM "procbus_topic_hold"("p_topic", "p_claim");
    RETURN QUERY
    UPDATE "procbus_topic_entries" AS e
    SET "batch_id" = o."batch_id", "batch_seq" = o."seq"
    FROM unnest("p_ids", "p_batch_ids") WITH ORDINALITY AS o("id", "batch_id", "seq")
    WHERE e."id" = o."id" AND e."topic" = "p_topic" AND e."batch_id" IS NULL
    RETURNING e."id", e."key", e."type", e."payload", e."bytes", e."webhook_id", e."created_at",
              e."attempts", e."last_error", e."txn_id", e."txn_last", e."txn_size";
    GET DIAGNOSTICS "taken" = ROW_COUNT;
    IF "taken" <> cardinality("p_ids") THEN
        RAISE EXCEPTION 'another delivery attempt took % of the % entries of these batches first',
            cardinality("p_ids") - "taken", cardinality("p_ids") USING ERRCODE = 'PBB01';
    END IF;
    IF "p_incomplete" > 0 THEN
        UPDATE "procbus_topics" AS t SET "incomplete_batches" = t."incomplete_batches" + "p_incomplete"
        WHERE t."name" = "p_topic";
    END IF;
END
$$;

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
-- Grouped topics keep their assembled batches as rows from 0015 on (assign_batches).
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

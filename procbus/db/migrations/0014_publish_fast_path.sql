-- What a publisher must know of its topic, kept on each shard row it takes capacity from, so
-- that a publish is one statement with no topic lookup: the UPDATE of the caller's own shard
-- (when it is free and has room) and the INSERT of the entry (procbus/topics/queries.sql,
-- publish). Anything else goes through procbus_topic_publish. A topic's settings never change
-- after it is created, so the copies cannot drift.

ALTER TABLE "procbus_topic_shards"
    ADD COLUMN "queues" boolean NOT NULL DEFAULT true,
    ADD COLUMN "max_payload_bytes" bigint NOT NULL DEFAULT 0,
    ADD COLUMN "grouped" boolean NOT NULL DEFAULT false;

UPDATE "procbus_topic_shards" AS s
SET "queues" = NOT t."sync", "max_payload_bytes" = t."max_payload_bytes",
    "grouped" = t."group_transactions"
FROM "procbus_topics" AS t
WHERE t."name" = s."topic";

ALTER TABLE "procbus_topic_shards"
    ALTER COLUMN "queues" DROP DEFAULT,
    ALTER COLUMN "max_payload_bytes" DROP DEFAULT,
    ALTER COLUMN "grouped" DROP DEFAULT;

-- The function's own fast path (the caller's shard, after a topic lookup) was that statement's:
-- the function keeps only the checked path, so the two cannot drift, and a caller that fell
-- back does not try its busy shard twice. (Capture triggers take the checked path.)
-- Publish one event in the caller's transaction, in one round trip: capacity from a shard,
-- the entry, and, for a keyed event, the key's lock, so that publishers of one key commit in
-- the order of their entries' IDs. Capacity comes through procbus_topic_admit (the caller's own
-- shard first); clients try the one-statement fast path first (procbus/topics/queries.sql,
-- publish) and come here when it did nothing. The transaction fields are kept on grouped topics
-- only; "grouped" tells the caller to mark its transaction's last event before it commits.
-- Errors: those of procbus_topic_admit.
CREATE OR REPLACE FUNCTION "procbus_topic_publish"(
    "p_topic" text,
    "p_shard" integer,
    "p_key" text,
    "p_type" text,
    "p_payload" text,
    "p_webhook_id" text,
    "p_txn_id" text,
    "p_txn_last" boolean,
    "p_txn_size" integer
) RETURNS TABLE ("id" bigint, "created_at" timestamptz, "grouped" boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    "size" bigint := octet_length("p_payload");
    "taken" integer;
    "is_grouped" boolean;
BEGIN
    SELECT a."shard", a."grouped" INTO "taken", "is_grouped"
    FROM "procbus_topic_admit"("p_topic", "p_shard", "size") AS a;
    IF "p_key" IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('procbus_topic_key:' || "p_topic" || '/' || "p_key", 0));
    END IF;
    RETURN QUERY
    INSERT INTO "procbus_topic_entries" AS e
        ("topic", "shard", "key", "type", "payload", "bytes", "webhook_id", "txn_id", "txn_last",
         "txn_size")
    VALUES ("p_topic", "taken", "p_key", "p_type", "p_payload"::jsonb, "size", "p_webhook_id",
            CASE WHEN "is_grouped" THEN "p_txn_id" END,
            "is_grouped" AND coalesce("p_txn_last", false),
            CASE WHEN "is_grouped" THEN "p_txn_size" END)
    RETURNING e."id", e."created_at", "is_grouped";
END
$$;

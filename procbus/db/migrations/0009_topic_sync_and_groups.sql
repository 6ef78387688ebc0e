-- Synchronous topics count their refused sends; transaction-grouped batches (procbus.batching):
-- events carry their transaction, and a grouped topic's batch is kept, in order, until it is
-- acknowledged, so a retry resends exactly the same batch.

ALTER TABLE "procbus_topics"
    -- Synchronous topics: sends the endpoint did not acknowledge.
    ADD COLUMN "nacked" bigint NOT NULL DEFAULT 0,
    -- Grouped topics: how long a transaction's missing events are waited for before the rest
    -- goes without them, and how many batches went out so.
    ADD COLUMN "incomplete_wait_seconds" double precision NOT NULL DEFAULT 60
        CHECK ("incomplete_wait_seconds" > 0),
    ADD COLUMN "incomplete_batches" bigint NOT NULL DEFAULT 0,
    -- Grouped topics: a batch shorter than batch_size waits until its oldest event is this old.
    ADD COLUMN "batch_seconds" double precision NOT NULL DEFAULT 0 CHECK ("batch_seconds" >= 0);

ALTER TABLE "procbus_topic_entries"
    ADD COLUMN "txn_id" text,
    ADD COLUMN "txn_last" boolean NOT NULL DEFAULT false,
    ADD COLUMN "txn_size" integer,
    -- The batch an entry was first sent in, and its place there: it is resent in that batch
    -- until acknowledged or dead-lettered.
    ADD COLUMN "batch_id" text,
    ADD COLUMN "batch_seq" integer;
CREATE INDEX "procbus_topic_entries_txn" ON "procbus_topic_entries" ("topic", "txn_id", "id")
WHERE "txn_id" IS NOT NULL;
CREATE INDEX "procbus_topic_entries_batch" ON "procbus_topic_entries" ("topic", "id")
WHERE "batch_id" IS NOT NULL;

ALTER TABLE "procbus_topic_dead_letters"
    ADD COLUMN "txn_id" text,
    ADD COLUMN "txn_last" boolean NOT NULL DEFAULT false,
    ADD COLUMN "txn_size" integer,
    ADD COLUMN "batch_id" text;

DROP FUNCTION "procbus_topic_reserve"(uuid, text, integer, bigint, double precision);
DROP FUNCTION "procbus_topic_publish"(text, integer, text, text, text, text);
DROP FUNCTION "procbus_topic_commit"(uuid, text, text, text, text);
DROP FUNCTION "procbus_topic_admit"(text, integer, bigint);

-- Admit one event of "p_bytes" to "p_topic": the topic exists and queues (it is not
-- synchronous), the payload fits, and capacity is taken from a shard (the caller's first);
-- returns the shard and whether the topic groups transactions. Errors: PBT01 no such topic,
-- PBT02 a synchronous topic, PBP01 payload too large, PBQ01 topic full.
CREATE FUNCTION "procbus_topic_admit"(
    "p_topic" text,
    "p_shard" integer,
    "p_bytes" bigint,
    OUT "shard" integer,
    OUT "grouped" boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    "topic" record;
BEGIN
    SELECT t."sync", t."max_payload_bytes", t."group_transactions" INTO "topic"
    FROM "procbus_topics" AS t WHERE t."name" = "p_topic";
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no topic named %', quote_literal("p_topic") USING ERRCODE = 'PBT01';
    END IF;
    IF "topic"."sync" THEN
        RAISE EXCEPTION 'topic % is synchronous: it delivers in the publishing call, it queues nothing', quote_literal("p_topic")
            USING ERRCODE = 'PBT02';
    END IF;
    IF "p_bytes" > "topic"."max_payload_bytes" THEN
        RAISE EXCEPTION 'the payload is % bytes; topic % takes at most %', "p_bytes", quote_literal("p_topic"),
            "topic"."max_payload_bytes" USING ERRCODE = 'PBP01';
    END IF;
    "shard" := "procbus_topic_take"("p_topic", "p_shard", "p_bytes");
    IF "shard" IS NULL THEN
        RAISE EXCEPTION 'topic % is full', quote_literal("p_topic") USING ERRCODE = 'PBQ01';
    END IF;
    "grouped" := "topic"."group_transactions";
END
$$;

-- Publish one event in the caller's transaction, in one round trip: capacity from a shard,
-- the entry, and, for a keyed event, the key's lock, so that publishers of one key commit in
-- the order of their entries' IDs. The fast path takes the caller's own shard when it has room
-- and no other publisher is writing it; anything else (another shard, a full topic, a refusal)
-- goes through procbus_topic_admit. The transaction fields are kept on grouped topics only;
-- "grouped" tells the caller to mark its transaction's last event before it commits.
-- Errors: those of procbus_topic_admit.
CREATE FUNCTION "procbus_topic_publish"(
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
    "topic" record;
    "taken" integer;
    "is_grouped" boolean;
BEGIN
    SELECT t."sync", t."max_payload_bytes", t."group_transactions" INTO "topic"
    FROM "procbus_topics" AS t WHERE t."name" = "p_topic";
    IF FOUND AND NOT "topic"."sync" AND "size" <= "topic"."max_payload_bytes" THEN
        UPDATE "procbus_topic_shards" AS s
        SET "entries" = s."entries" + 1, "bytes" = s."bytes" + "size"
        WHERE s."topic" = "p_topic" AND s."shard" = "p_shard"
          AND s."entries" + 1 <= s."max_entries" AND s."bytes" + "size" <= s."max_bytes"
          AND s."shard" = (
              SELECT c."shard" FROM "procbus_topic_shards" AS c
              WHERE c."topic" = "p_topic" AND c."shard" = "p_shard"
              FOR UPDATE SKIP LOCKED
          )
        RETURNING s."shard" INTO "taken";
        "is_grouped" := "topic"."group_transactions";
    END IF;
    IF "taken" IS NULL THEN
        SELECT a."shard", a."grouped" INTO "taken", "is_grouped"
        FROM "procbus_topic_admit"("p_topic", "p_shard", "size") AS a;
    END IF;
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

-- Two-phase publish, phase one: take capacity for an event of up to "p_bytes" and hold it for
-- "p_seconds". Errors: those of procbus_topic_admit.
CREATE FUNCTION "procbus_topic_reserve"(
    "p_id" uuid,
    "p_topic" text,
    "p_shard" integer,
    "p_bytes" bigint,
    "p_seconds" double precision
) RETURNS TABLE ("shard" integer, "expires_at" timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO "procbus_topic_reservations" AS r ("id", "topic", "shard", "bytes", "expires_at")
    VALUES ("p_id", "p_topic", ("procbus_topic_admit"("p_topic", "p_shard", "p_bytes"))."shard",
            "p_bytes", clock_timestamp() + make_interval(secs => "p_seconds"))
    RETURNING r."shard", r."expires_at";
END
$$;

-- Phase two: the reserved capacity becomes the entry. Returns the outcome: 'committed' (with
-- the entry), 'expired' (the reservation ran out: its capacity is given back, nothing queued)
-- or 'unknown' (committed, aborted or reclaimed already). PBP02: the event is larger than
-- its reservation (nothing changes). An operation that commits several times passes one
-- transaction ID each time, and marks its last event.
CREATE FUNCTION "procbus_topic_commit"(
    "p_id" uuid,
    "p_key" text,
    "p_type" text,
    "p_payload" text,
    "p_webhook_id" text,
    "p_txn_id" text,
    "p_txn_last" boolean,
    "p_txn_size" integer
) RETURNS TABLE ("outcome" text, "topic" text, "id" bigint, "created_at" timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    "size" bigint := octet_length("p_payload");
    "held" record;
BEGIN
    DELETE FROM "procbus_topic_reservations" AS r WHERE r."id" = "p_id"
    RETURNING r."topic", r."shard", r."bytes", r."expires_at" < clock_timestamp() AS "expired"
    INTO "held";
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::text, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF "held"."expired" THEN
        UPDATE "procbus_topic_shards" AS s
        SET "entries" = s."entries" - 1, "bytes" = s."bytes" - "held"."bytes"
        WHERE s."topic" = "held"."topic" AND s."shard" = "held"."shard";
        RETURN QUERY SELECT 'expired'::text, "held"."topic", NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF "size" > "held"."bytes" THEN
        RAISE EXCEPTION 'the event is % bytes; its reservation holds %', "size", "held"."bytes"
            USING ERRCODE = 'PBP02';
    END IF;
    IF "size" < "held"."bytes" THEN
        UPDATE "procbus_topic_shards" AS s SET "bytes" = s."bytes" - ("held"."bytes" - "size")
        WHERE s."topic" = "held"."topic" AND s."shard" = "held"."shard";
    END IF;
    IF "p_key" IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('procbus_topic_key:' || "held"."topic" || '/' || "p_key", 0));
    END IF;
    RETURN QUERY
    INSERT INTO "procbus_topic_entries" AS e
        ("topic", "shard", "key", "type", "payload", "bytes", "webhook_id", "txn_id", "txn_last",
         "txn_size")
    VALUES ("held"."topic", "held"."shard", "p_key", "p_type", "p_payload"::jsonb, "size",
            "p_webhook_id", "p_txn_id", coalesce("p_txn_last", false), "p_txn_size")
    RETURNING 'committed'::text, e."topic", e."id", e."created_at";
END
$$;

-- What decides a grouped topic's next batch, in one round trip: the head of its queue outside
-- kept batches ("in_window", read by index probes in queue order whatever the statistics say: a
-- freshly filled queue looks tiny to the planner, which would then read all of it), and, when the
-- head is full, the rest of the transactions that start in it and end beyond it, read through the
-- transaction index (never by reading on). "blocked": the event may not go yet, because an earlier
-- event of its key waits in a kept batch, or (beyond the head) lies unread between the head's end
-- and it. "any_kept": the topic has kept batches.
CREATE FUNCTION "procbus_topic_view"("p_topic" text, "p_limit" integer)
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
    "now" timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    "kept" boolean := EXISTS (
        SELECT 1 FROM "procbus_topic_entries" AS k
        WHERE k."topic" = "p_topic" AND k."batch_id" IS NOT NULL
    );
BEGIN
    RETURN QUERY
    WITH "head" AS MATERIALIZED (
        SELECT e."id", e."key", e."txn_id", e."txn_last", e."txn_size", e."created_at"
        FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic" AND e."batch_id" IS NULL
        ORDER BY e."id"
        LIMIT "p_limit"
    ), "edge" AS (
        SELECT max(h."id") AS "last", count(*) AS "read" FROM "head" AS h
    ), "open" AS (
        SELECT h."txn_id" FROM "head" AS h
        WHERE h."txn_id" IS NOT NULL
        GROUP BY h."txn_id"
        HAVING NOT bool_or(h."txn_last") OR count(*) < max(h."txn_size")
    ), "rest" AS (
        SELECT e."id", e."key", e."txn_id", e."txn_last", e."txn_size", e."created_at",
               "edge"."last" AS "head_end"
        FROM "edge", "procbus_topic_entries" AS e
        WHERE "edge"."read" = "p_limit" AND e."topic" = "p_topic"
          AND e."txn_id" IN (SELECT o."txn_id" FROM "open" AS o)
          AND e."id" > "edge"."last" AND e."batch_id" IS NULL
    )
    SELECT h."id", h."key", h."txn_id", h."txn_last", h."txn_size", h."created_at",
           ("kept" AND h."key" IS NOT NULL AND EXISTS (
               SELECT 1 FROM "procbus_topic_entries" AS p
               WHERE p."topic" = "p_topic" AND p."key" = h."key" AND p."id" < h."id"
                 AND p."batch_id" IS NOT NULL
           )),
           true, "kept", clock_timestamp()
    FROM "head" AS h
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
           false, "kept", clock_timestamp()
    FROM "rest" AS r
    ORDER BY 1;
END
$$;

-- Keep assembled batches: each entry's batch ("p_batch_ids", parallel to "p_ids") and its place
-- in the send order, claimed by "p_claim", and count the batches that go without a
-- transaction's missing events ("p_incomplete"). All or nothing: PBB01 when an overlapping
-- attempt took some of the entries first. By primary key, whatever the statistics say.
CREATE FUNCTION "procbus_topic_assign"(
    "p_topic" text,
    "p_batch_ids" text[],
    "p_claim" uuid,
    "p_seconds" double precision,
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
    RETURN QUERY
    UPDATE "procbus_topic_entries" AS e
    SET "batch_id" = o."batch_id", "batch_seq" = o."seq", "claim" = "p_claim",
        "claimed_until" = clock_timestamp() + make_interval(secs => "p_seconds")
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

-- Persistent notification topics (procbus/topics): bounded two-phase queues in PostgreSQL.

CREATE TABLE "procbus_topics" (
    "name" text PRIMARY KEY,
    "endpoint" text NOT NULL,
    "sync" boolean NOT NULL DEFAULT false,
    "max_entries" bigint NOT NULL CHECK ("max_entries" > 0),
    "max_bytes" bigint NOT NULL CHECK ("max_bytes" > 0),
    "max_retries" integer NOT NULL CHECK ("max_retries" >= 0),
    "retry_sleep_seconds" double precision NOT NULL CHECK ("retry_sleep_seconds" > 0),
    "ttl_seconds" double precision NOT NULL CHECK ("ttl_seconds" > 0),
    "batch_size" integer NOT NULL CHECK ("batch_size" > 0),
    "group_transactions" boolean NOT NULL DEFAULT false,
    "shards" integer NOT NULL CHECK ("shards" > 0),
    -- One event's payload at most: it must fit one shard.
    "max_payload_bytes" bigint NOT NULL CHECK ("max_payload_bytes" > 0),
    -- Set when the endpoint answered 410 Gone: nothing is sent until `procbus topic enable`.
    "disabled_at" timestamptz,
    "disabled_reason" text,
    -- Running totals, written by the topic's one delivery owner (never by publishers).
    "delivered" bigint NOT NULL DEFAULT 0,
    "retried" bigint NOT NULL DEFAULT 0,
    "dead_lettered" bigint NOT NULL DEFAULT 0,
    "created_at" timestamptz NOT NULL DEFAULT now()
);

-- Signing secrets (Standard Webhooks, whsec_...): here only, never in workflow history or logs.
-- During a rotation the old secret signs too, until "retired_at".
CREATE TABLE "procbus_topic_secrets" (
    "topic" text NOT NULL REFERENCES "procbus_topics" ("name") ON DELETE CASCADE,
    "secret" text NOT NULL,
    "created_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "retired_at" timestamptz,
    PRIMARY KEY ("topic", "secret")
);

-- A topic's capacity, split in shards so that its publishers do not queue up on one hot row:
-- each publisher takes capacity from a shard of its own when it can (entries and bytes,
-- committed and reserved). The shards' bounds add up to the topic's.
CREATE TABLE "procbus_topic_shards" (
    "topic" text NOT NULL,
    "shard" integer NOT NULL,
    "entries" bigint NOT NULL DEFAULT 0,
    "bytes" bigint NOT NULL DEFAULT 0,
    "max_entries" bigint NOT NULL,
    "max_bytes" bigint NOT NULL,
    PRIMARY KEY ("topic", "shard"),
    CHECK ("entries" >= 0 AND "bytes" >= 0)
);

-- Capacity taken for an event that is not committed yet (two-phase publish).
CREATE TABLE "procbus_topic_reservations" (
    "id" uuid PRIMARY KEY,
    "topic" text NOT NULL,
    "shard" integer NOT NULL,
    "bytes" bigint NOT NULL,
    "created_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "expires_at" timestamptz NOT NULL
);
CREATE INDEX "procbus_topic_reservations_expiry" ON "procbus_topic_reservations" ("topic", "expires_at");

-- Committed events waiting for delivery. "id" is queue order; publishers of one key are
-- serialised, so for each key it is commit order. Retry state lives with the entry.
CREATE TABLE "procbus_topic_entries" (
    "id" bigserial PRIMARY KEY,
    "topic" text NOT NULL,
    "shard" integer NOT NULL,
    "key" text,
    "type" text NOT NULL,
    "payload" jsonb NOT NULL,
    "bytes" bigint NOT NULL,
    -- The Standard Webhooks message ID: the same on every retry and after a redrive.
    "webhook_id" text NOT NULL,
    "created_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "attempts" integer NOT NULL DEFAULT 0,
    "next_attempt_at" timestamptz NOT NULL DEFAULT '-infinity',
    "last_error" text,
    "history" jsonb NOT NULL DEFAULT '[]',
    -- The delivery attempt that holds the entry: only that attempt may settle it.
    "claim" uuid,
    "claimed_until" timestamptz
);
CREATE INDEX "procbus_topic_entries_queue" ON "procbus_topic_entries" ("topic", "id");
CREATE INDEX "procbus_topic_entries_key" ON "procbus_topic_entries" ("topic", "key", "id")
WHERE "key" IS NOT NULL;

-- Entries past max_retries or their TTL: kept with their attempt history, never dropped, until
-- redriven (with their original webhook_id) or deleted by an operator.
CREATE TABLE "procbus_topic_dead_letters" (
    "id" bigint PRIMARY KEY,
    "topic" text NOT NULL,
    "key" text,
    "type" text NOT NULL,
    "payload" jsonb NOT NULL,
    "bytes" bigint NOT NULL,
    "webhook_id" text NOT NULL,
    "created_at" timestamptz NOT NULL,
    "attempts" integer NOT NULL,
    "last_error" text,
    "history" jsonb NOT NULL,
    "dead_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "reason" text NOT NULL
);
CREATE INDEX "procbus_topic_dead_letters_topic" ON "procbus_topic_dead_letters" ("topic", "id");

-- Take capacity for one event of "p_bytes" from a shard of "p_topic", the caller's own shard
-- first; returns the shard, or NULL when the topic is full. A shard another publisher is
-- writing is skipped rather than waited for; only when all are busy does it wait. Expired
-- reservations give their capacity back before a topic is called full.
CREATE FUNCTION "procbus_topic_take"("p_topic" text, "p_shard" integer, "p_bytes" bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "taken" integer;
    "attempt" integer;
BEGIN
    FOR "attempt" IN 1..2 LOOP
        UPDATE "procbus_topic_shards" AS s
        SET "entries" = s."entries" + 1, "bytes" = s."bytes" + "p_bytes"
        WHERE (s."topic", s."shard") = (
            SELECT c."topic", c."shard" FROM "procbus_topic_shards" AS c
            WHERE c."topic" = "p_topic"
              AND c."entries" + 1 <= c."max_entries" AND c."bytes" + "p_bytes" <= c."max_bytes"
            ORDER BY c."shard" < "p_shard", c."shard"
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        )
        RETURNING s."shard" INTO "taken";
        IF "taken" IS NOT NULL THEN
            RETURN "taken";
        END IF;
        -- Every shard with room is busy, or none has room: wait for the first with room.
        UPDATE "procbus_topic_shards" AS s
        SET "entries" = s."entries" + 1, "bytes" = s."bytes" + "p_bytes"
        WHERE (s."topic", s."shard") = (
            SELECT c."topic", c."shard" FROM "procbus_topic_shards" AS c
            WHERE c."topic" = "p_topic"
              AND c."entries" + 1 <= c."max_entries" AND c."bytes" + "p_bytes" <= c."max_bytes"
            ORDER BY c."shard" < "p_shard", c."shard"
            LIMIT 1
            FOR UPDATE
        )
          AND s."entries" + 1 <= s."max_entries" AND s."bytes" + "p_bytes" <= s."max_bytes"
        RETURNING s."shard" INTO "taken";
        IF "taken" IS NOT NULL THEN
            RETURN "taken";
        END IF;
        IF "attempt" = 1 THEN
            PERFORM "procbus_topic_reclaim"("p_topic");
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- Give back the capacity of "p_topic"'s expired reservations (their owners died); how many.
CREATE FUNCTION "procbus_topic_reclaim"("p_topic" text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "reclaimed" integer;
BEGIN
    WITH "expired" AS (
        DELETE FROM "procbus_topic_reservations" AS r
        WHERE r."topic" = "p_topic" AND r."expires_at" < clock_timestamp()
        RETURNING r."shard", r."bytes"
    ), "per_shard" AS (
        SELECT e."shard", count(*) AS "entries", sum(e."bytes") AS "bytes"
        FROM "expired" AS e GROUP BY e."shard"
    ), "given_back" AS (
        UPDATE "procbus_topic_shards" AS s
        SET "entries" = s."entries" - p."entries", "bytes" = s."bytes" - p."bytes"
        FROM "per_shard" AS p
        WHERE s."topic" = "p_topic" AND s."shard" = p."shard"
        RETURNING p."entries"
    )
    SELECT coalesce(sum(g."entries"), 0) INTO "reclaimed" FROM "given_back" AS g;
    RETURN "reclaimed";
END
$$;

-- Admit one event of "p_bytes" to "p_topic": the topic exists and queues (it is not
-- synchronous), the payload fits, and capacity is taken from a shard (the caller's first);
-- returns the shard. Errors: PBT01 no such topic, PBT02 a synchronous topic, PBP01 payload too
-- large, PBQ01 topic full.
CREATE FUNCTION "procbus_topic_admit"("p_topic" text, "p_shard" integer, "p_bytes" bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "topic" record;
    "taken" integer;
BEGIN
    SELECT t."sync", t."max_payload_bytes" INTO "topic"
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
    "taken" := "procbus_topic_take"("p_topic", "p_shard", "p_bytes");
    IF "taken" IS NULL THEN
        RAISE EXCEPTION 'topic % is full', quote_literal("p_topic") USING ERRCODE = 'PBQ01';
    END IF;
    RETURN "taken";
END
$$;

-- Publish one event in the caller's transaction, in one round trip: capacity from a shard,
-- the entry, and, for a keyed event, the key's lock, so that publishers of one key commit in
-- the order of their entries' IDs. Errors: those of procbus_topic_admit.
CREATE FUNCTION "procbus_topic_publish"(
    "p_topic" text,
    "p_shard" integer,
    "p_key" text,
    "p_type" text,
    "p_payload" text,
    "p_webhook_id" text
) RETURNS TABLE ("id" bigint, "created_at" timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    "size" bigint := octet_length("p_payload");
    "taken" integer;
BEGIN
    "taken" := "procbus_topic_admit"("p_topic", "p_shard", "size");
    IF "p_key" IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('procbus_topic_key:' || "p_topic" || '/' || "p_key", 0));
    END IF;
    RETURN QUERY
    INSERT INTO "procbus_topic_entries" AS e
        ("topic", "shard", "key", "type", "payload", "bytes", "webhook_id")
    VALUES ("p_topic", "taken", "p_key", "p_type", "p_payload"::jsonb, "size", "p_webhook_id")
    RETURNING e."id", e."created_at";
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
    VALUES ("p_id", "p_topic", "procbus_topic_admit"("p_topic", "p_shard", "p_bytes"), "p_bytes",
            clock_timestamp() + make_interval(secs => "p_seconds"))
    RETURNING r."shard", r."expires_at";
END
$$;

-- Phase two: the reserved capacity becomes the entry. Returns the outcome: 'committed' (with
-- the entry), 'expired' (the reservation ran out: its capacity is given back, nothing queued)
-- or 'unknown' (committed, aborted or reclaimed already). PBP02: the event is larger than
-- its reservation (nothing changes).
CREATE FUNCTION "procbus_topic_commit"(
    "p_id" uuid,
    "p_key" text,
    "p_type" text,
    "p_payload" text,
    "p_webhook_id" text
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
        ("topic", "shard", "key", "type", "payload", "bytes", "webhook_id")
    VALUES ("held"."topic", "held"."shard", "p_key", "p_type", "p_payload"::jsonb, "size", "p_webhook_id")
    RETURNING 'committed'::text, e."topic", e."id", e."created_at";
END
$$;

-- Abort: the reservation's capacity back; an unknown reservation is no error.
CREATE FUNCTION "procbus_topic_abort"("p_id" uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    "held" record;
BEGIN
    DELETE FROM "procbus_topic_reservations" AS r WHERE r."id" = "p_id"
    RETURNING r."topic", r."shard", r."bytes" INTO "held";
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE "procbus_topic_shards" AS s
    SET "entries" = s."entries" - 1, "bytes" = s."bytes" - "held"."bytes"
    WHERE s."topic" = "held"."topic" AND s."shard" = "held"."shard";
    RETURN true;
END
$$;

-- A delivery attempt's batch, in queue order: entries due, not held by a live claim, and not
-- behind an earlier entry of the same key that waits for its retry (only that key waits).
-- The claim is fenced by the UPDATE's own condition, re-checked against a concurrent claim, so
-- no row lock is taken to read. Index probes in queue order, whatever the table's statistics
-- say: a freshly filled queue looks tiny to the planner.
CREATE FUNCTION "procbus_topic_claim"(
    "p_topic" text,
    "p_limit" integer,
    "p_claim" uuid,
    "p_seconds" double precision
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
BEGIN
    RETURN QUERY
    WITH "due" AS (
        SELECT e."id" FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic"
          AND e."next_attempt_at" <= clock_timestamp()
          AND (e."claimed_until" IS NULL OR e."claimed_until" < clock_timestamp())
          AND (e."key" IS NULL OR NOT EXISTS (
              SELECT 1 FROM "procbus_topic_entries" AS p
              WHERE p."topic" = e."topic" AND p."key" = e."key" AND p."id" < e."id"
                AND (p."next_attempt_at" > clock_timestamp() OR p."claimed_until" >= clock_timestamp())
          ))
        ORDER BY e."id"
        LIMIT "p_limit"
    )
    UPDATE "procbus_topic_entries" AS e
    SET "claim" = "p_claim", "claimed_until" = clock_timestamp() + make_interval(secs => "p_seconds")
    FROM "due" AS d
    WHERE e."id" = d."id"
      AND (e."claimed_until" IS NULL OR e."claimed_until" < clock_timestamp())
    RETURNING e."id", e."key", e."type", e."payload", e."bytes", e."webhook_id", e."created_at",
              e."attempts", e."last_error";
END
$$;

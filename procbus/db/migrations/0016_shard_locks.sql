-- A shard's capacity is taken under an advisory lock of its own (procbus_topic_shard_lock),
-- not a row lock: the publish fast path tries the lock and skips a busy shard, which costs
-- less than the row lock SKIP LOCKED took (a write-ahead record and a dirtied page on every
-- publish). Every other writer of a shard's counts takes the same lock first, waiting for it
-- and in shard order (procbus_topic_give_back), so a publisher holding the lock never waits
-- on the row.
--
-- The counts' CHECK goes: PostgreSQL reads and prepares a table's CHECK constraints again in
-- every statement that writes to it, on every publish; the tests check the counts instead.

ALTER TABLE "procbus_topic_shards" DROP CONSTRAINT "procbus_topic_shards_check";

-- The advisory lock that stands for a shard: whoever changes its counts holds it.
CREATE FUNCTION "procbus_topic_shard_lock"("p_topic" text, "p_shard" integer) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('procbus_topic_shard:' || "p_topic" || '/' || "p_shard"::text, 0)
$$;

-- Capacity given back to shards of "p_topic" (delivered, dead-lettered, aborted or expired):
-- "p_entries" entries and "p_bytes" bytes to the shard at the same place in "p_shards" (a shard
-- may come more than once). The shards' locks are taken in shard order, waiting.
CREATE FUNCTION "procbus_topic_give_back"(
    "p_topic" text,
    "p_shards" integer[],
    "p_entries" bigint[],
    "p_bytes" bigint[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", g."shard"))
    FROM (SELECT DISTINCT u."shard" FROM unnest("p_shards") AS u("shard")) AS g
    ORDER BY g."shard";
    UPDATE "procbus_topic_shards" AS s
    SET "entries" = s."entries" - g."entries", "bytes" = s."bytes" - g."bytes"
    FROM (
        SELECT u."shard", sum(u."entries") AS "entries", sum(u."bytes") AS "bytes"
        FROM unnest("p_shards", "p_entries", "p_bytes") AS u("shard", "entries", "bytes")
        GROUP BY u."shard"
    ) AS g
    WHERE s."topic" = "p_topic" AND s."shard" = g."shard";
END
$$;

CREATE OR REPLACE FUNCTION "procbus_topic_take"("p_topic" text, "p_shard" integer, "p_bytes" bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "candidate" integer;
    "waiting" boolean;
    "attempt" integer;
BEGIN
    FOR "attempt" IN 1..2 LOOP
        -- The shards with room whose lock is free, the caller's own first; when all are busy,
        -- the same again, waiting for each lock in turn.
        FOREACH "waiting" IN ARRAY ARRAY[false, true] LOOP
            FOR "candidate" IN
                SELECT c."shard" FROM "procbus_topic_shards" AS c
                WHERE c."topic" = "p_topic"
                  AND c."entries" + 1 <= c."max_entries" AND c."bytes" + "p_bytes" <= c."max_bytes"
                ORDER BY c."shard" < "p_shard", c."shard"
            LOOP
                IF "waiting" THEN
                    PERFORM pg_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", "candidate"));
                ELSIF NOT pg_try_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", "candidate")) THEN
                    CONTINUE;
                END IF;
                -- Under the lock, the room again: another publisher may have taken it.
                UPDATE "procbus_topic_shards" AS s
                SET "entries" = s."entries" + 1, "bytes" = s."bytes" + "p_bytes"
                WHERE s."topic" = "p_topic" AND s."shard" = "candidate"
                  AND s."entries" + 1 <= s."max_entries" AND s."bytes" + "p_bytes" <= s."max_bytes";
                IF FOUND THEN
                    RETURN "candidate";
                END IF;
            END LOOP;
        END LOOP;
        IF "attempt" = 1 THEN
            PERFORM "procbus_topic_reclaim"("p_topic");
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION "procbus_topic_reclaim"("p_topic" text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "shards" integer[];
    "sizes" bigint[];
BEGIN
    WITH "expired" AS (
        DELETE FROM "procbus_topic_reservations" AS r
        WHERE r."topic" = "p_topic" AND r."expires_at" < clock_timestamp()
        RETURNING r."shard", r."bytes"
    )
    SELECT coalesce(array_agg(e."shard"), '{}'), coalesce(array_agg(e."bytes"), '{}')
    INTO "shards", "sizes"
    FROM "expired" AS e;
    PERFORM "procbus_topic_give_back"(
        "p_topic", "shards", array_fill(1::bigint, ARRAY[cardinality("shards")]), "sizes");
    RETURN cardinality("shards");
END
$$;

CREATE OR REPLACE FUNCTION "procbus_topic_commit"(
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
        PERFORM "procbus_topic_give_back"(
            "held"."topic", ARRAY["held"."shard"], ARRAY[1::bigint], ARRAY["held"."bytes"]);
        RETURN QUERY SELECT 'expired'::text, "held"."topic", NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF "size" > "held"."bytes" THEN
        RAISE EXCEPTION 'the event is % bytes; its reservation holds %', "size", "held"."bytes"
            USING ERRCODE = 'PBP02';
    END IF;
    IF "size" < "held"."bytes" THEN
        PERFORM "procbus_topic_give_back"(
            "held"."topic", ARRAY["held"."shard"], ARRAY[0::bigint], ARRAY["held"."bytes" - "size"]);
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

CREATE OR REPLACE FUNCTION "procbus_topic_abort"("p_id" uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    "held" record;
BEGIN
    DELETE FROM "procbus_topic_reservations" AS r WHERE r."id" = "p_id"
    RETURNING r."topic", r."shard", r."bytes" INTO "held";
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM "procbus_topic_give_back"(
        "held"."topic", ARRAY["held"."shard"], ARRAY[1::bigint], ARRAY["held"."bytes"]);
    RETURN true;
END
$$;

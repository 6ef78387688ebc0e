-- Capacity leased to a publishing connection in blocks, so that a publish writes its entry and
-- no counter row (measured: the counter row's update cost 9-14% of a single-row business
-- transaction, a lease row's share lock 2%). A lease takes "entries" and "bytes" from its shard
-- at once, with the IDs of the entries it may queue; its owner counts what it uses in memory.
-- Entries that leave the queue while their lease is open are counted on it ("settled_*"), so
-- its end gives back exactly what it never used. Only for events without a key or a
-- transaction, on topics that do not group: their IDs need not follow commit order.
CREATE TABLE "procbus_topic_leases" (
    "id" bigserial PRIMARY KEY,
    "topic" text NOT NULL REFERENCES "procbus_topics" ("name") ON DELETE CASCADE,
    "shard" integer NOT NULL,
    "entries" bigint NOT NULL,
    "bytes" bigint NOT NULL,
    "settled_entries" bigint NOT NULL DEFAULT 0,
    "settled_bytes" bigint NOT NULL DEFAULT 0,
    "entry_ids" bigint[] NOT NULL,
    "expires_at" timestamptz NOT NULL
);
CREATE INDEX "procbus_topic_leases_expiry" ON "procbus_topic_leases" ("topic", "expires_at");

-- The lease an entry was queued under, if any.
ALTER TABLE "procbus_topic_entries" ADD COLUMN "lease" bigint;

-- Entries that left the queue (delivered or dead-lettered): their capacity back to their shards,
-- and those queued under a lease still open counted on it too. The leases' rows are locked (in
-- ID order) before any shard's lock; procbus_topic_end_leases, which takes the shards' locks
-- first, only ever skips a locked lease, so the two never wait for each other in a circle.
CREATE FUNCTION "procbus_topic_give_back_entries"(
    "p_topic" text,
    "p_shards" integer[],
    "p_bytes" bigint[],
    "p_leases" bigint[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF "p_shards" IS NULL THEN
        RETURN;  -- nothing left the queue
    END IF;
    IF EXISTS (SELECT FROM unnest("p_leases") AS u("lease") WHERE u."lease" IS NOT NULL) THEN
        PERFORM FROM "procbus_topic_leases" AS l
        WHERE l."topic" = "p_topic" AND l."id" = ANY ("p_leases")
        ORDER BY l."id"
        FOR NO KEY UPDATE;
        UPDATE "procbus_topic_leases" AS l
        SET "settled_entries" = l."settled_entries" + g."entries",
            "settled_bytes" = l."settled_bytes" + g."bytes"
        FROM (
            SELECT u."lease", count(*) AS "entries", sum(u."bytes") AS "bytes"
            FROM unnest("p_leases", "p_bytes") AS u("lease", "bytes")
            WHERE u."lease" IS NOT NULL
            GROUP BY u."lease"
        ) AS g
        WHERE l."topic" = "p_topic" AND l."id" = g."lease";
    END IF;
    PERFORM "procbus_topic_give_back"(
        "p_topic", "p_shards", array_fill(1::bigint, ARRAY[cardinality("p_shards")]), "p_bytes");
END
$$;

-- End leases of "p_topic": "p_lease" (its owner is done with it), or with NULL every expired one.
-- Each gives back what it never used: its capacity less its entries still queued and those that
-- already left. A lease whose row another transaction holds (a publisher using it, a delivery
-- settling on it) is skipped: it ends next time. The shards' locks come first, waited for with
-- "p_wait", else tried (a busy shard: nothing ends now). Returns how many ended.
CREATE FUNCTION "procbus_topic_end_leases"("p_topic" text, "p_lease" bigint, "p_wait" boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "locked" integer[] := '{}';
    "candidate" integer;
    "ended" record;
    "live" record;
    "count" integer := 0;
BEGIN
    FOR "candidate" IN
        SELECT DISTINCT l."shard" FROM "procbus_topic_leases" AS l
        WHERE l."topic" = "p_topic"
          AND (l."id" = "p_lease" OR ("p_lease" IS NULL AND l."expires_at" <= clock_timestamp()))
        ORDER BY 1
    LOOP
        IF "p_wait" THEN
            PERFORM pg_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", "candidate"));
        ELSIF NOT pg_try_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", "candidate")) THEN
            RETURN 0;
        END IF;
        "locked" := "locked" || "candidate";
    END LOOP;
    FOR "ended" IN
        DELETE FROM "procbus_topic_leases" AS l
        WHERE l."id" IN (
            SELECT c."id" FROM "procbus_topic_leases" AS c
            WHERE c."topic" = "p_topic" AND c."shard" = ANY ("locked")
              AND (c."id" = "p_lease" OR ("p_lease" IS NULL AND c."expires_at" <= clock_timestamp()))
            ORDER BY c."id"
            FOR UPDATE SKIP LOCKED
        )
        RETURNING l."shard", l."entries", l."bytes", l."settled_entries", l."settled_bytes",
                  l."entry_ids"
    LOOP
        SELECT count(*) AS "entries", coalesce(sum(e."bytes"), 0)::bigint AS "bytes" INTO "live"
        FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic" AND e."id" = ANY ("ended"."entry_ids");
        PERFORM "procbus_topic_give_back"(
            "p_topic", ARRAY["ended"."shard"],
            ARRAY["ended"."entries" - "ended"."settled_entries" - "live"."entries"],
            ARRAY["ended"."bytes" - "ended"."settled_bytes" - "live"."bytes"]);
        "count" := "count" + 1;
    END LOOP;
    RETURN "count";
END
$$;

-- Give back the capacity of "p_topic"'s expired reservations (their owners died), and end its
-- expired leases when their shards are free; how many reservations.
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
    PERFORM "procbus_topic_end_leases"("p_topic", NULL, false);
    RETURN cardinality("shards");
END
$$;

-- The entries of capacity "p_topic"'s leases hold and have not used yet (index probes: the
-- leases' entry IDs).
CREATE FUNCTION "procbus_topic_leased"("p_topic" text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(l."entries" - l."settled_entries" - (
        SELECT count(*) FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic" AND e."id" = ANY (l."entry_ids"))), 0)::bigint
    FROM "procbus_topic_leases" AS l
    WHERE l."topic" = "p_topic"
$$;

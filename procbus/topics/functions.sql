-- The functions of persistent topics (procbus/topics): applied by migrate() after the numbered
-- migrations, and again whenever this file changes. Every statement must be safe to run again over
-- what it made (CREATE OR REPLACE). A function that leaves this file is dropped by a numbered
-- migration (DROP FUNCTION), as is one whose arguments or result type change (then made anew here).

-- A topic is a bounded queue in PostgreSQL: a publish takes capacity from one of its shards
-- (procbus_topic_admit) and queues an entry in the caller's transaction; two-phase publishes
-- reserve first and commit later. One delivery owner per topic claims, sends and settles in
-- rounds; a claim fences out older attempts, and an owner epoch fences out older owners.

-- The advisory lock that stands for a shard: whoever changes its counts holds it.
CREATE OR REPLACE FUNCTION "procbus_topic_shard_lock"("p_topic" text, "p_shard" integer) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('procbus_topic_shard:' || "p_topic" || '/' || "p_shard"::text, 0)
$$;

-- Capacity given back to shards of "p_topic" (delivered, dead-lettered, aborted or expired):
-- "p_entries" entries and "p_bytes" bytes to the shard at the same place in "p_shards" (a shard
-- may come more than once). The shards' locks are taken in shard order, waiting.
CREATE OR REPLACE FUNCTION "procbus_topic_give_back"(
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

-- Entries that left the queue (delivered or dead-lettered): their capacity back to their shards,
-- and those queued under a lease still open counted on it too. The leases' rows are locked (in
-- ID order) before any shard's lock; procbus_topic_end_leases, which takes the shards' locks
-- first, only ever skips a locked lease, so the two never wait for each other in a circle.
CREATE OR REPLACE FUNCTION "procbus_topic_give_back_entries"(
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

-- A publish under a lease reads no table and takes no lock (measured: reading and share-locking
-- the lease's row cost 12% of a single-row business transaction, an advisory lock held shared
-- 4%). Instead:
-- - the lease is armed in the session that took it: a setting named for its topic holds its
--   ID. Settings set in a transaction that rolls back (or a savepoint) are undone with it, so
--   the setting names a lease only if the lease's row committed (or is the caller's own
--   transaction's);
-- - the publish checks the server's clock against the lease's expiry, so nothing is queued
--   under it once it expired;
-- - only that session publishes under it, so whoever ends an expired lease first waits for the
--   transaction its owner had open when it expired (seen in pg_locks: its virtual transaction
--   ID), and then sees every entry queued under it.

-- The transaction the session of server process "p_pid" has open now (its virtual transaction
-- ID, which it holds a lock on until it ends), or NULL when it is idle or gone.
CREATE OR REPLACE FUNCTION "procbus_open_transaction"("p_pid" integer) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT k."virtualxid" FROM pg_locks AS k
    WHERE k."locktype" = 'virtualxid' AND k."pid" = "p_pid" AND k."mode" = 'ExclusiveLock'
      AND k."granted"
    LIMIT 1
$$;

-- End leases of "p_topic": "p_lease" (its owner is done with it, in its own session), or with
-- NULL every expired one whose owner has no transaction open from before it expired (one seen
-- open is recorded, and the lease ends once that one has ended). Each gives back what it never
-- used: its capacity less its entries still queued and those that already left. A lease whose
-- row another transaction holds (a delivery settling on it) is skipped: it ends next time. The
-- shards' locks come first, waited for with "p_wait", else tried (a busy shard: nothing ends
-- now). Returns how many ended.
CREATE OR REPLACE FUNCTION "procbus_topic_end_leases"(
    "p_topic" text, "p_lease" bigint, "p_wait" boolean
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "locked" integer[] := '{}';
    "candidate" integer;
    "lease" record;
    "open" text;
    "free" bigint[] := '{}';
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
    FOR "lease" IN
        SELECT l."id", l."owner_pid", l."waiting_for" FROM "procbus_topic_leases" AS l
        WHERE l."topic" = "p_topic" AND l."shard" = ANY ("locked")
          AND (l."id" = "p_lease" OR ("p_lease" IS NULL AND l."expires_at" <= clock_timestamp()))
        ORDER BY l."id"
    LOOP
        IF "lease"."owner_pid" = pg_backend_pid() THEN
            "free" := "free" || "lease"."id";  -- its own session: no other transaction of it
            CONTINUE;
        END IF;
        IF "p_lease" IS NOT NULL THEN
            CONTINUE;  -- only its owner ends a lease before it expires
        END IF;
        "open" := "procbus_open_transaction"("lease"."owner_pid");
        IF "open" IS NULL OR "open" IS DISTINCT FROM coalesce("lease"."waiting_for", "open") THEN
            -- Idle or gone, or the transaction seen open has ended: a later one found the lease
            -- expired, and what the earlier ones queued is committed (or gone) by now.
            "free" := "free" || "lease"."id";
        ELSIF "lease"."waiting_for" IS NULL THEN
            UPDATE "procbus_topic_leases" AS l SET "waiting_for" = "open"
            WHERE l."id" IN (
                SELECT c."id" FROM "procbus_topic_leases" AS c
                WHERE c."id" = "lease"."id"
                FOR UPDATE SKIP LOCKED
            );
        END IF;
    END LOOP;
    FOR "ended" IN
        DELETE FROM "procbus_topic_leases" AS l
        WHERE l."id" IN (
            SELECT c."id" FROM "procbus_topic_leases" AS c
            WHERE c."topic" = "p_topic" AND c."id" = ANY ("free")
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

-- Before a topic's entries go (its row locked, so no lease is taken meanwhile): its leases, once
-- those of other live sessions expired and the transactions those sessions had open then ended,
-- so that no entry queued under them outlives the topic. The caller's own session is disarmed
-- ("p_setting": the topic's lease setting) instead. Waits a lease's lifetime at most, and then
-- for open transactions at most "p_wait_seconds": past that it refuses (PBT03), leaving all as
-- it was.
CREATE OR REPLACE FUNCTION "procbus_topic_delete_leases"(
    "p_topic" text, "p_setting" text, "p_wait_seconds" double precision
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    "expiry" timestamptz;
    "waiting" text[];
    "deadline" timestamptz;
BEGIN
    PERFORM set_config("p_setting", '', false);
    SELECT max(l."expires_at") INTO "expiry"
    FROM "procbus_topic_leases" AS l
    WHERE l."topic" = "p_topic" AND l."owner_pid" <> pg_backend_pid()
      AND EXISTS (SELECT FROM pg_stat_activity AS a WHERE a."pid" = l."owner_pid");
    IF "expiry" IS NOT NULL THEN
        PERFORM pg_sleep(greatest(extract(epoch FROM "expiry" - clock_timestamp()), 0)::float8);
        SELECT array_agg(o."open") INTO "waiting"
        FROM (
            SELECT DISTINCT "procbus_open_transaction"(l."owner_pid") AS "open"
            FROM "procbus_topic_leases" AS l
            WHERE l."topic" = "p_topic" AND l."owner_pid" <> pg_backend_pid()
        ) AS o
        WHERE o."open" IS NOT NULL;
        "deadline" := clock_timestamp() + make_interval(secs => "p_wait_seconds");
        WHILE EXISTS (
            SELECT FROM pg_locks AS k
            WHERE k."locktype" = 'virtualxid' AND k."virtualxid" = ANY ("waiting")
              AND k."mode" = 'ExclusiveLock' AND k."granted"
        ) LOOP
            IF clock_timestamp() > "deadline" THEN
                RAISE EXCEPTION 'topic % is not deleted: a transaction that may have published '
                    'to it is still open after % s; delete it again once it ended',
                    "p_topic", "p_wait_seconds" USING ERRCODE = 'PBT03';
            END IF;
            PERFORM pg_sleep(0.01);
        END LOOP;
    END IF;
    DELETE FROM "procbus_topic_leases" AS l WHERE l."topic" = "p_topic";
END
$$;

-- The entries of capacity "p_topic"'s leases hold and have not used yet (index probes: the
-- leases' entry IDs).
CREATE OR REPLACE FUNCTION "procbus_topic_leased"("p_topic" text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(l."entries" - l."settled_entries" - (
        SELECT count(*) FROM "procbus_topic_entries" AS e
        WHERE e."topic" = "p_topic" AND e."id" = ANY (l."entry_ids"))), 0)::bigint
    FROM "procbus_topic_leases" AS l
    WHERE l."topic" = "p_topic"
$$;

-- Take capacity for one event of "p_bytes" from a shard of "p_topic", the caller's own shard
-- first; returns the shard, or NULL when the topic is full. A shard whose lock another
-- publisher holds is skipped rather than waited for; only when all are busy does it wait, and
-- then for one shard's lock at a time, at most "procbus_topic_shard_wait" long, asking again
-- which shards have room after each wait. A publisher holds the locks of the shards it tried
-- until it commits, so two that waited for each other's on a list read earlier deadlocked;
-- a short wait and a fresh list never do. Expired reservations give their capacity back before
-- a topic is called full.
CREATE OR REPLACE FUNCTION "procbus_topic_take"("p_topic" text, "p_shard" integer, "p_bytes" bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "candidate" integer;
    "attempt" integer;
    "any_room" boolean;
    "locked" boolean;
    "caller_lock_timeout" text;
BEGIN
    FOR "attempt" IN 1..2 LOOP
        -- The shards with room whose lock is free, the caller's own first.
        FOR "candidate" IN
            SELECT c."shard" FROM "procbus_topic_shards" AS c
            WHERE c."topic" = "p_topic"
              AND c."entries" + 1 <= c."max_entries" AND c."bytes" + "p_bytes" <= c."max_bytes"
            ORDER BY c."shard" < "p_shard", c."shard"
        LOOP
            CONTINUE WHEN NOT pg_try_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", "candidate"));
            -- Under the lock, the room again: another publisher may have taken it.
            UPDATE "procbus_topic_shards" AS s
            SET "entries" = s."entries" + 1, "bytes" = s."bytes" + "p_bytes"
            WHERE s."topic" = "p_topic" AND s."shard" = "candidate"
              AND s."entries" + 1 <= s."max_entries" AND s."bytes" + "p_bytes" <= s."max_bytes";
            IF FOUND THEN
                RETURN "candidate";
            END IF;
        END LOOP;
        IF "attempt" = 1 THEN
            PERFORM "procbus_topic_reclaim"("p_topic");
        END IF;
    END LOOP;
    -- Every shard with room is busy: wait for them in turn, briefly, until one serves or none
    -- has room left.
    "caller_lock_timeout" := current_setting('lock_timeout');
    LOOP
        "any_room" := false;
        FOR "candidate" IN
            SELECT c."shard" FROM "procbus_topic_shards" AS c
            WHERE c."topic" = "p_topic"
              AND c."entries" + 1 <= c."max_entries" AND c."bytes" + "p_bytes" <= c."max_bytes"
            ORDER BY c."shard" < "p_shard", c."shard"
        LOOP
            "any_room" := true;
            BEGIN
                PERFORM set_config('lock_timeout', "procbus_topic_shard_wait"(), true);
                PERFORM pg_advisory_xact_lock("procbus_topic_shard_lock"("p_topic", "candidate"));
                "locked" := true;
            EXCEPTION WHEN lock_not_available THEN
                "locked" := false;
            END;
            PERFORM set_config('lock_timeout', "caller_lock_timeout", true);
            CONTINUE WHEN NOT "locked";
            UPDATE "procbus_topic_shards" AS s
            SET "entries" = s."entries" + 1, "bytes" = s."bytes" + "p_bytes"
            WHERE s."topic" = "p_topic" AND s."shard" = "candidate"
              AND s."entries" + 1 <= s."max_entries" AND s."bytes" + "p_bytes" <= s."max_bytes";
            IF FOUND THEN
                RETURN "candidate";
            END IF;
        END LOOP;
        EXIT WHEN NOT "any_room";
    END LOOP;
    RETURN NULL;
END
$$;

-- How long a publisher waits for one busy shard's lock before it looks again: well under
-- PostgreSQL's deadlock_timeout (1 s by default), so no wait lasts until a deadlock check.
CREATE OR REPLACE FUNCTION "procbus_topic_shard_wait"() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT '100ms' $$;

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

-- Admit one event of "p_bytes" to "p_topic": the topic exists and queues (it is not
-- synchronous), the payload fits, and capacity is taken from a shard (the caller's first);
-- returns the shard and whether the topic groups transactions. Errors: PBT01 no such topic,
-- PBT02 a synchronous topic, PBP01 payload too large, PBQ01 topic full.
CREATE OR REPLACE FUNCTION "procbus_topic_admit"(
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
    SELECT t."sync", t."max_payload_bytes", t."group_transactions", t."disabled_at",
           t."disabled_reason" INTO "topic"
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
        -- A stopped delivery is why a topic fills up: the writer it refuses is told so.
        RAISE EXCEPTION 'topic % is full%', quote_literal("p_topic"),
            CASE WHEN "topic"."disabled_at" IS NULL THEN '' ELSE
                format(' (its delivery is disabled: %s)', "topic"."disabled_reason") END
            USING ERRCODE = 'PBQ01';
    END IF;
    "grouped" := "topic"."group_transactions";
END
$$;

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

-- Two-phase publish, phase one: take capacity for an event of up to "p_bytes" and hold it for
-- "p_seconds". Errors: those of procbus_topic_admit.
CREATE OR REPLACE FUNCTION "procbus_topic_reserve"(
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

-- Batches assembled for a claim, as it is settled (or as they are found unsettled): those named
-- in "p_kept" (all, when NULL) are written onto their entries, to be resent whole and in their
-- order; every row of "p_settled" (all, when NULL) goes.
CREATE OR REPLACE FUNCTION "procbus_topic_keep_batches"("p_topic" text, "p_kept" text[], "p_settled" text[] DEFAULT NULL)
RETURNS void
LANGUAGE sql AS $$
    UPDATE "procbus_topic_entries" AS e SET "batch_id" = b."batch_id", "batch_seq" = o."seq"
    FROM "procbus_topic_batches" AS b, unnest(b."entry_ids") WITH ORDINALITY AS o("id", "seq")
    WHERE b."topic" = "p_topic" AND ("p_kept" IS NULL OR b."batch_id" = ANY ("p_kept"))
      AND e."id" = o."id" AND e."topic" = "p_topic";
    DELETE FROM "procbus_topic_batches" AS b
    WHERE b."topic" = "p_topic" AND ("p_settled" IS NULL OR b."batch_id" = ANY ("p_settled"));
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
CREATE OR REPLACE FUNCTION "procbus_topic_view"(
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
-- The rows a look returns are kept in memory up to this, and written to disk beyond: at the
-- default 4 MB a pipeline's look of 80,000 changes went to disk (0.37-0.41 s against 0.30-0.39 s).
SET work_mem = '64MB'
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


-- Abort: the reservation's capacity back; an unknown reservation is no error.
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

-- A delivery attempt's batch, in queue order: entries due and not behind an earlier entry of
-- the same key that waits for its retry (only that key waits). The claim becomes the topic's
-- one claim when it holds anything (an idle topic's look writes nothing). Index probes in queue
-- order, whatever the table's statistics say: a freshly filled queue looks tiny to the planner.
CREATE OR REPLACE FUNCTION "procbus_topic_claim"(
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
SET work_mem = '64MB'  -- as procbus_topic_view's: the rows it returns stay in memory
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

-- Make "p_claim" the topic's one claim: an older one is fenced out from now on. Only an attempt
-- of the topic's current owner epoch ("p_epoch"; NULL: whatever it is now) may: an older one (a
-- zombie past its take-over) is refused with PBT04, also when it races the take-over (that
-- leaves the new epoch in the claim's row, which this then finds). PBT01: no such topic.
CREATE OR REPLACE FUNCTION "procbus_topic_hold"("p_topic" text, "p_claim" uuid, "p_epoch" bigint)
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

-- One event as procbus.delivery.clients.event_body makes it: {"type", "timestamp", "topic",
-- "key", "data"}, and "transaction" {"id", "last", "size"} for an event of a grouped topic's
-- transaction; the timestamp RFC 3339 in UTC, with microseconds only when there are any, as
-- pydantic writes it. A single expression, so PostgreSQL inlines it into the statement. Bodies
-- built here cost 2.6 µs an event against 5.9 µs decoded and encoded again in the worker.
CREATE OR REPLACE FUNCTION "procbus_topic_event_json"(
    "p_topic_json" text,
    "p_type" text,
    "p_created_at" timestamptz,
    "p_key" text,
    "p_payload" jsonb,
    "p_txn_id" text,
    "p_txn_last" boolean,
    "p_txn_size" integer
) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT '{"type":' || to_json("p_type")::text
        || ',"timestamp":"' || to_char("p_created_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN extract(microseconds FROM "p_created_at")::bigint % 1000000 = 0
                THEN '' ELSE to_char("p_created_at" AT TIME ZONE 'UTC', '.US') END
        || 'Z","topic":' || "p_topic_json"
        || ',"key":' || coalesce(to_json("p_key")::text, 'null')
        || ',"data":' || "p_payload"::text
        || CASE WHEN "p_txn_id" IS NULL THEN '' ELSE
               ',"transaction":{"id":' || to_json("p_txn_id")::text
               || ',"last":' || CASE WHEN "p_txn_last" THEN 'true' ELSE 'false' END
               || ',"size":' || coalesce("p_txn_size"::text, 'null') || '}' END
        || '}'
$$;

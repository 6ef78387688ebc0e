-- A publish under a lease reads no table (measured: reading and share-locking the lease's row
-- cost 12% of a single-row business transaction). Instead:
-- - the lease is armed in its session: a setting named for its topic holds its ID. Settings
--   set in a transaction that rolls back (or a savepoint) are undone with it, so the setting
--   names a lease only if the lease's row committed (or is the caller's own transaction's);
-- - the publish checks the server's clock against the lease's expiry, so nothing is queued
--   under it once it expired;
-- - the publish holds the lease's advisory lock shared until its transaction ends, so whoever
--   ends the lease sees every entry queued under it: an end tries the lock exclusively first,
--   and skips a lease whose publishers' transactions are still open.
-- An expired lease ends only after that lock; a topic's delete waits for its leases to expire.

-- The server process whose session took the lease: only that session arms it, and a topic's
-- delete need not wait for the leases of sessions that are gone.
ALTER TABLE "procbus_topic_leases" ADD COLUMN "owner_pid" integer NOT NULL DEFAULT pg_backend_pid();

-- A lease's advisory lock, in the two-key form (apart from the one-key locks of shards): its
-- ID's low 32 bits, two leases 2^32 apart sharing a lock at worst. Shared by its publishes
-- (tried: a lease being ended is not used), exclusive for its end (tried) and a topic's delete.
CREATE FUNCTION "procbus_topic_lease_shared"("p_lease" bigint) RETURNS boolean
LANGUAGE sql AS $$
    SELECT pg_try_advisory_xact_lock_shared(
        1885500465, ("p_lease" % 4294967296 - 2147483648)::integer)
$$;

CREATE FUNCTION "procbus_topic_lease_exclusive"("p_lease" bigint, "p_wait" boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    "key" integer := ("p_lease" % 4294967296 - 2147483648)::integer;
BEGIN
    IF "p_wait" THEN
        PERFORM pg_advisory_xact_lock(1885500465, "key");
        RETURN true;
    END IF;
    RETURN pg_try_advisory_xact_lock(1885500465, "key");
END
$$;

-- End leases of "p_topic": "p_lease" (its owner is done with it), or with NULL every expired one.
-- Each gives back what it never used: its capacity less its entries still queued and those that
-- already left. A lease whose publishers' transactions are still open (its advisory lock) or
-- whose row another transaction holds (a delivery settling on it) is skipped: it ends next time.
-- The shards' locks come first, waited for with "p_wait", else tried (a busy shard: nothing ends
-- now). Returns how many ended.
CREATE OR REPLACE FUNCTION "procbus_topic_end_leases"(
    "p_topic" text, "p_lease" bigint, "p_wait" boolean
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    "locked" integer[] := '{}';
    "candidate" integer;
    "lease" bigint;
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
    -- No publish under these leases is in flight from here on (a later one fails its lock, or
    -- its clock once expired), and the statements below see all they queued.
    FOR "lease" IN
        SELECT l."id" FROM "procbus_topic_leases" AS l
        WHERE l."topic" = "p_topic" AND l."shard" = ANY ("locked")
          AND (l."id" = "p_lease" OR ("p_lease" IS NULL AND l."expires_at" <= clock_timestamp()))
        ORDER BY l."id"
    LOOP
        IF "procbus_topic_lease_exclusive"("lease", false) THEN
            "free" := "free" || "lease";
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
-- the ones of live sessions expired and their publishers' transactions ended, so that no entry
-- queued under them outlives the topic. The caller's own session is disarmed ("p_setting": the
-- topic's lease setting) instead of waited for. Waits at most a lease's lifetime.
CREATE FUNCTION "procbus_topic_delete_leases"("p_topic" text, "p_setting" text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    "expiry" timestamptz;
BEGIN
    PERFORM set_config("p_setting", '', false);
    SELECT max(l."expires_at") INTO "expiry"
    FROM "procbus_topic_leases" AS l
    WHERE l."topic" = "p_topic" AND l."owner_pid" <> pg_backend_pid()
      AND EXISTS (SELECT FROM pg_stat_activity AS a WHERE a."pid" = l."owner_pid");
    IF "expiry" IS NOT NULL THEN
        PERFORM pg_sleep(greatest(extract(epoch FROM "expiry" - clock_timestamp()), 0)::float8);
    END IF;
    PERFORM "procbus_topic_lease_exclusive"(l."id", true)
    FROM "procbus_topic_leases" AS l WHERE l."topic" = "p_topic"
    ORDER BY l."id";
    DELETE FROM "procbus_topic_leases" AS l WHERE l."topic" = "p_topic";
END
$$;

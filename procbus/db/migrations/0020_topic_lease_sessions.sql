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

-- The server process whose session took the lease; and the transaction that session had open
-- after the lease expired, which its end waits for.
ALTER TABLE "procbus_topic_leases"
    ADD COLUMN "owner_pid" integer NOT NULL DEFAULT pg_backend_pid(),
    ADD COLUMN "waiting_for" text;

-- The transaction the session of server process "p_pid" has open now (its virtual transaction
-- ID, which it holds a lock on until it ends), or NULL when it is idle or gone.
CREATE FUNCTION "procbus_open_transaction"("p_pid" integer) RETURNS text
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
CREATE FUNCTION "procbus_topic_delete_leases"(
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

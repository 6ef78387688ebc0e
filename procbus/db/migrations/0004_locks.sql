-- Hierarchical locks with leases and fencing tokens (procbus/locks.py).
-- Every resource a lock was ever taken on keeps its newest fencing token, so tokens only grow.
CREATE TABLE "procbus_lock_resources" (
    "resource" text PRIMARY KEY,
    "last_token" bigint NOT NULL DEFAULT 0
);

-- FIFO order across the whole table: a lock set is queued in one transaction that holds all its
-- resources, so two sets are in the same order on every resource they share, which is what rules
-- out deadlock.
CREATE SEQUENCE "procbus_lock_queue";

-- One row per holder and resource: waiting while "token" is NULL, granted once it is set.
CREATE TABLE "procbus_locks" (
    -- No foreign key: acquire creates the resource row in the same transaction, and the check
    -- would cost a row lock per request.
    "resource" text NOT NULL,
    "holder" text NOT NULL,
    "mode" text NOT NULL CHECK ("mode" IN ('IS', 'IX', 'S', 'SIX', 'X')),
    -- Ancestor procedures whose locks this holder inherits: their grants never block it.
    "family" text[] NOT NULL DEFAULT '{}',
    "queue_position" bigint NOT NULL DEFAULT nextval('procbus_lock_queue'),
    "token" bigint,
    "requested_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "granted_at" timestamptz,
    "lease_expires_at" timestamptz NOT NULL,
    PRIMARY KEY ("resource", "holder")
);
CREATE INDEX "procbus_locks_holder" ON "procbus_locks" ("holder");

-- Gray's compatibility matrix for multiple-granularity locking (symmetric).
CREATE FUNCTION "procbus_lock_compatible"("held" text, "wanted" text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE "held"
        WHEN 'IS' THEN "wanted" <> 'X'
        WHEN 'IX' THEN "wanted" IN ('IS', 'IX')
        WHEN 'S' THEN "wanted" IN ('IS', 'S')
        WHEN 'SIX' THEN "wanted" = 'IS'
        ELSE false
    END
$$;

-- Grant, in queue order, every waiting request on these resources that is compatible with the
-- granted ones and with every request queued before it (so readers never starve a writer).
-- The caller has serialised the resources (procbus_lock_serialise). Returns the holders that
-- got a grant.
CREATE FUNCTION "procbus_lock_grant"("p_resources" text[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    "waiter" record;
    "new_token" bigint;
BEGIN
    FOR "waiter" IN
        SELECT w."resource", w."holder", w."mode", w."family", w."queue_position"
        FROM "procbus_locks" AS w
        WHERE w."resource" = ANY ("p_resources") AND w."token" IS NULL
        ORDER BY w."resource", w."queue_position"
    LOOP
        IF NOT EXISTS (
            SELECT 1 FROM "procbus_locks" AS o
            WHERE o."resource" = "waiter"."resource"
              AND o."holder" <> "waiter"."holder"
              AND NOT (o."holder" = ANY ("waiter"."family"))
              AND (o."token" IS NOT NULL OR o."queue_position" < "waiter"."queue_position")
              AND NOT "procbus_lock_compatible"(o."mode", "waiter"."mode")
        ) THEN
            UPDATE "procbus_lock_resources" AS r SET "last_token" = r."last_token" + 1
            WHERE r."resource" = "waiter"."resource"
            RETURNING r."last_token" INTO "new_token";
            UPDATE "procbus_locks" AS l
            SET "token" = "new_token", "granted_at" = clock_timestamp()
            WHERE l."resource" = "waiter"."resource" AND l."holder" = "waiter"."holder";
            RETURN NEXT "waiter"."holder";
        END IF;
    END LOOP;
END
$$;

-- Serialise every change to these resources' queues: transaction-scoped advisory locks, taken in
-- one order (sorted), held to commit. In memory only: no row is written to take them.
CREATE FUNCTION "procbus_lock_serialise"("p_resources" text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('procbus_lock:' || sorted.r, 0))
    FROM (SELECT DISTINCT r FROM unnest("p_resources") AS r ORDER BY r) AS sorted;
END
$$;

-- Queue a holder's lock set (or renew its place) and grant what can be granted, in one
-- transaction. Idempotent: calling it again renews the leases and reports the state.
CREATE FUNCTION "procbus_lock_acquire"(
    "p_holder" text,
    "p_family" text[],
    "p_resources" text[],
    "p_modes" text[],
    "p_lease_seconds" double precision
) RETURNS TABLE (
    "resource" text,
    "mode" text,
    "token" bigint,
    "lease_expires_at" timestamptz,
    "blockers" jsonb,
    "woken" text[]
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    "lease" timestamptz;
    "queued" integer;
    "expired" integer;
    "granted_holders" text[];
BEGIN
    IF "p_lease_seconds" IS NULL OR "p_lease_seconds" <= 0 THEN
        RAISE EXCEPTION 'the lease must be more than 0 seconds, got %', "p_lease_seconds"
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality("p_resources") IS DISTINCT FROM cardinality("p_modes") THEN
        RAISE EXCEPTION 'resources and modes differ in length' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    "lease" := clock_timestamp() + make_interval(secs => "p_lease_seconds");
    PERFORM "procbus_lock_serialise"("p_resources");
    INSERT INTO "procbus_lock_resources" ("resource")
    SELECT r FROM unnest("p_resources") AS r ORDER BY r
    ON CONFLICT DO NOTHING;
    -- An expired lease releases its lock: its holder is presumed dead.
    DELETE FROM "procbus_locks" AS l
    WHERE l."resource" = ANY ("p_resources") AND l."lease_expires_at" < clock_timestamp();
    GET DIAGNOSTICS "expired" = ROW_COUNT;
    SELECT count(*) INTO "queued" FROM "procbus_locks" AS l
    WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources");
    IF "queued" = cardinality("p_resources") THEN
        UPDATE "procbus_locks" AS l SET "lease_expires_at" = "lease"
        WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources");
    ELSE
        -- New, or it lost part of its place: queue the whole set again, from the back, so its
        -- requests keep one position relative to every other set.
        DELETE FROM "procbus_locks" AS l
        WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources");
        -- At the back of every queue, a request is granted at once exactly when it is
        -- compatible with everything queued or granted there (its family's locks aside).
        WITH "wanted" AS (
            SELECT t.r, t.m FROM unnest("p_resources", "p_modes") AS t(r, m)
        ), "free" AS (
            SELECT w.r FROM "wanted" AS w
            WHERE NOT EXISTS (
                SELECT 1 FROM "procbus_locks" AS o
                WHERE o."resource" = w.r
                  AND NOT (o."holder" = ANY (coalesce("p_family", '{}')))
                  AND NOT "procbus_lock_compatible"(o."mode", w.m)
            )
        ), "bumped" AS (
            -- = ANY (array): an index probe per resource, whatever the table's size.
            UPDATE "procbus_lock_resources" AS r SET "last_token" = r."last_token" + 1
            WHERE r."resource" = ANY (ARRAY(SELECT f.r FROM "free" AS f))
            RETURNING r."resource", r."last_token"
        )
        INSERT INTO "procbus_locks"
            ("resource", "holder", "mode", "family", "token", "granted_at", "lease_expires_at")
        SELECT w.r, "p_holder", w.m, coalesce("p_family", '{}'), b."last_token",
               CASE WHEN b."last_token" IS NOT NULL THEN clock_timestamp() END, "lease"
        FROM "wanted" AS w LEFT JOIN "bumped" AS b ON b."resource" = w.r
        ORDER BY w.r;
    END IF;
    IF "expired" > 0 OR ("queued" > 0 AND "queued" < cardinality("p_resources")) THEN
        -- Locks were freed here: whoever queued behind them may go now.
        SELECT array_agg(DISTINCT g) INTO "granted_holders"
        FROM "procbus_lock_grant"("p_resources") AS g WHERE g <> "p_holder";
    END IF;
    RETURN QUERY
    SELECT l."resource", l."mode", l."token", l."lease_expires_at",
           CASE WHEN l."token" IS NULL THEN
               (SELECT coalesce(jsonb_agg(jsonb_build_object(
                            'holder', o."holder", 'mode', o."mode", 'granted', o."token" IS NOT NULL)
                        ORDER BY o."token" IS NULL, o."queue_position"), '[]'::jsonb)
                FROM "procbus_locks" AS o
                WHERE o."resource" = l."resource"
                  AND o."holder" <> l."holder"
                  AND NOT (o."holder" = ANY (l."family"))
                  AND (o."token" IS NOT NULL OR o."queue_position" < l."queue_position")
                  AND NOT "procbus_lock_compatible"(o."mode", l."mode"))
           END,
           coalesce("granted_holders", '{}')
    FROM "procbus_locks" AS l
    WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources")
    ORDER BY l."resource";
END
$$;

-- Release every lock and queue place of a holder, then grant what that frees.
-- Returns the other holders that got a grant, so they can be told at once.
CREATE FUNCTION "procbus_lock_release"("p_holder" text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    "held" text[];
BEGIN
    SELECT array_agg(l."resource") INTO "held"
    FROM "procbus_locks" AS l WHERE l."holder" = "p_holder";
    IF "held" IS NULL THEN
        RETURN;
    END IF;
    PERFORM "procbus_lock_serialise"("held");
    DELETE FROM "procbus_locks" AS l
    WHERE l."resource" = ANY ("held")
      AND (l."holder" = "p_holder" OR l."lease_expires_at" < clock_timestamp());
    IF EXISTS (
        SELECT 1 FROM "procbus_locks" AS l WHERE l."resource" = ANY ("held") AND l."token" IS NULL
    ) THEN
        RETURN QUERY SELECT DISTINCT g FROM "procbus_lock_grant"("held") AS g;
    END IF;
END
$$;

-- Locks at a steady rate however many have come and gone (bench/locks.py).
-- PL/pgSQL planned every statement again on each call (custom plans for the array parameters),
-- and a plan made while "procbus_locks" was nearly empty scanned it whole, dead rows included,
-- as it churned. The lock functions now keep one plan per session, made of index probes, and
-- plain index scans rather than bitmap scans, so dead index entries get marked and skipped.

-- Waiting requests only: "is anyone waiting here?" stays one probe when no one is.
CREATE INDEX "procbus_locks_waiting" ON "procbus_locks" ("resource", "queue_position")
WHERE "token" IS NULL;

-- The advisory lock key of a resource's queue.
CREATE FUNCTION "procbus_lock_key"("resource" text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('procbus_lock:' || "resource", 0)
$$;

CREATE OR REPLACE FUNCTION "procbus_lock_serialise"("p_resources" text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock("procbus_lock_key"(sorted.r))
    FROM (SELECT DISTINCT r FROM unnest("p_resources") AS r ORDER BY r) AS sorted;
END
$$;

ALTER FUNCTION "procbus_lock_grant"(text[])
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_bitmapscan = off;

CREATE OR REPLACE FUNCTION "procbus_lock_acquire"(
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
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
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
    PERFORM pg_advisory_xact_lock("procbus_lock_key"(sorted.r))
    FROM (SELECT DISTINCT r FROM unnest("p_resources") AS r ORDER BY r) AS sorted;
    -- The common case in one statement: a new set that nothing in the way of, granted at once.
    RETURN QUERY
    WITH "wanted" AS (
        SELECT w.r, w.m, NOT EXISTS (
            SELECT 1 FROM "procbus_locks" AS o
            WHERE o."resource" = w.r
              AND NOT (o."holder" = ANY (coalesce("p_family", '{}')))
              AND NOT "procbus_lock_compatible"(o."mode", w.m)
        ) AS "free"
        FROM unnest("p_resources", "p_modes") AS w(r, m)
    ), "go" AS (
        SELECT bool_and(w."free") AND NOT EXISTS (
            SELECT 1 FROM "procbus_locks" AS l
            WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources")
        ) AS "ahead"
        FROM "wanted" AS w
    ), "tokens" AS (
        INSERT INTO "procbus_lock_resources" AS res ("resource", "last_token")
        SELECT w.r, 1 FROM "wanted" AS w, "go" WHERE "go"."ahead" ORDER BY w.r
        ON CONFLICT ("resource") DO UPDATE SET "last_token" = res."last_token" + 1
        RETURNING res."resource", res."last_token"
    )
    INSERT INTO "procbus_locks" AS l
        ("resource", "holder", "mode", "family", "token", "granted_at", "lease_expires_at")
    SELECT w.r, "p_holder", w.m, coalesce("p_family", '{}'), t."last_token", clock_timestamp(),
           "lease"
    FROM "wanted" AS w JOIN "tokens" AS t ON t."resource" = w.r
    ORDER BY w.r
    RETURNING l."resource", l."mode", l."token", l."lease_expires_at", NULL::jsonb, '{}'::text[];
    IF FOUND THEN
        RETURN;
    END IF;
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
        IF "queued" > 0 THEN
            -- It lost part of its place: queue the whole set again, from the back, so its
            -- requests keep one position relative to every other set.
            DELETE FROM "procbus_locks" AS l
            WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources");
        END IF;
        -- At the back of every queue, a request is granted at once exactly when it is
        -- compatible with everything queued or granted there (its family's locks aside). The
        -- resource row is created on first use and its token bumped for each grant.
        WITH "wanted" AS (
            SELECT w.r, w.m, NOT EXISTS (
                SELECT 1 FROM "procbus_locks" AS o
                WHERE o."resource" = w.r
                  AND NOT (o."holder" = ANY (coalesce("p_family", '{}')))
                  AND NOT "procbus_lock_compatible"(o."mode", w.m)
            ) AS "free"
            FROM unnest("p_resources", "p_modes") AS w(r, m)
        ), "tokens" AS (
            INSERT INTO "procbus_lock_resources" AS res ("resource", "last_token")
            SELECT w.r, CASE WHEN w."free" THEN 1 ELSE 0 END FROM "wanted" AS w ORDER BY w.r
            ON CONFLICT ("resource") DO UPDATE SET "last_token" = res."last_token" + 1
            WHERE excluded."last_token" > 0
            RETURNING res."resource", res."last_token"
        )
        INSERT INTO "procbus_locks"
            ("resource", "holder", "mode", "family", "token", "granted_at", "lease_expires_at")
        SELECT w.r, "p_holder", w.m, coalesce("p_family", '{}'),
               CASE WHEN w."free" THEN t."last_token" END,
               CASE WHEN w."free" THEN clock_timestamp() END, "lease"
        FROM "wanted" AS w LEFT JOIN "tokens" AS t ON t."resource" = w.r
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

-- Release every lock and queue place of a holder, then grant what that frees. Expired leases
-- on these resources are cleared only when someone waits there; the next acquire clears them
-- anyway. Returns the other holders that got a grant, so they can be told at once.
CREATE OR REPLACE FUNCTION "procbus_lock_release"("p_holder" text) RETURNS SETOF text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    "held" text[];
    "others_wait" boolean;
BEGIN
    -- Each resource's queue is serialised (in one order) as it is read.
    SELECT array_agg(held_resource.r) INTO "held"
    FROM (
        SELECT ordered.r, pg_advisory_xact_lock("procbus_lock_key"(ordered.r))
        FROM (
            SELECT DISTINCT l."resource" AS r FROM "procbus_locks" AS l
            WHERE l."holder" = "p_holder" ORDER BY 1
        ) AS ordered
    ) AS held_resource;
    IF "held" IS NULL THEN
        RETURN;
    END IF;
    WITH "gone" AS (DELETE FROM "procbus_locks" AS l WHERE l."holder" = "p_holder")
    SELECT EXISTS (
        SELECT 1 FROM "procbus_locks" AS l
        WHERE l."resource" = ANY ("held") AND l."token" IS NULL AND l."holder" <> "p_holder"
    ) INTO "others_wait";
    IF "others_wait" THEN
        DELETE FROM "procbus_locks" AS l
        WHERE l."resource" = ANY ("held") AND l."lease_expires_at" < clock_timestamp();
        RETURN QUERY SELECT DISTINCT g FROM "procbus_lock_grant"("held") AS g;
    END IF;
END
$$;

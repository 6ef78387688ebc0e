-- The functions of hierarchical locks (procbus/locks): applied by migrate() after the numbered
-- migrations, and again whenever this file changes. Every statement must be safe to run again over
-- what it made (CREATE OR REPLACE). A function that leaves this file is dropped by a numbered
-- migration (DROP FUNCTION), as is one whose arguments or result type change (then made anew here).

-- Hierarchical locks with leases and fencing tokens: acquire queues a holder's whole lock set in
-- one transaction under the resources' advisory locks (taken in one order), so two sets are in
-- the same order on every resource they share, and grants go in queue order.

-- The lock functions keep one plan per session, made of index probes (plan_cache_mode and the
-- scan settings): the lock table churns, and a plan made on an empty table would scan it whole.

-- Gray's compatibility matrix for multiple-granularity locking (symmetric).
CREATE OR REPLACE FUNCTION "procbus_lock_compatible"("held" text, "wanted" text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE "held"
        WHEN 'IS' THEN "wanted" <> 'X'
        WHEN 'IX' THEN "wanted" IN ('IS', 'IX')
        WHEN 'S' THEN "wanted" IN ('IS', 'S')
        WHEN 'SIX' THEN "wanted" = 'IS'
        ELSE false
    END
$$;

-- The advisory lock key of a resource's queue.
CREATE OR REPLACE FUNCTION "procbus_lock_key"("resource" text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('procbus_lock:' || "resource", 0)
$$;

-- Grant, in queue order, every waiting request on these resources that is compatible with the
-- granted ones and with every request queued before it (so readers never starve a writer).
-- The caller holds the resources' advisory locks (procbus_lock_key). Returns the holders that
-- got a grant.
CREATE OR REPLACE FUNCTION "procbus_lock_grant"("p_resources" text[]) RETURNS SETOF text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
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

-- Queue the set behind what stands in its way, renew its place if it is already queued, grant
-- what can be granted, and report each request with what it waits behind. The caller holds the
-- resources' advisory locks (procbus_lock_acquire).
CREATE OR REPLACE FUNCTION "procbus_lock_enqueue"(
    "p_holder" text,
    "p_family" text[],
    "p_resources" text[],
    "p_modes" text[],
    "lease" timestamptz
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
    "queued" integer;
    "expired" integer;
    "granted_holders" text[];
BEGIN
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

-- Queue a holder's lock set and grant what can be granted, in one transaction. The common case
-- (nothing stands in the way) is one index probe per resource and two inserts; the rest goes to
-- procbus_lock_enqueue. Idempotent: calling it again renews the leases and reports the state.
CREATE OR REPLACE FUNCTION "procbus_lock_acquire"(
    "p_holder" text,
    "p_family" text[],
    "p_resources" text[],
    "p_modes" text[],
    "p_lease_seconds" double precision,
    "p_execution" text
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
    -- Read under the resources' advisory locks: a release of them commits before this looks.
    IF "p_execution" IS NOT NULL AND EXISTS (
        SELECT FROM "procbus_lock_releases" AS d
        WHERE d."holder" = "p_holder" AND d."execution" = "p_execution"
    ) THEN
        RAISE EXCEPTION 'the locks of % were released when its execution % ended: a late request '
            '(a resumed worker running an old workflow task) takes none', "p_holder", "p_execution"
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Granted at once when no request of this holder is queued on these resources yet and
    -- nothing there conflicts (granted or queued, its family's locks aside).
    RETURN QUERY
    WITH "tokens" AS (
        INSERT INTO "procbus_lock_resources" AS res ("resource", "last_token")
        SELECT w.r, 1 FROM unnest("p_resources") AS w(r)
        WHERE NOT EXISTS (
            SELECT 1 FROM unnest("p_resources", "p_modes") AS q(r, m)
            JOIN "procbus_locks" AS o ON o."resource" = q.r
            WHERE o."holder" = "p_holder"
               OR (NOT (o."holder" = ANY (coalesce("p_family", '{}')))
                   AND NOT "procbus_lock_compatible"(o."mode", q.m))
        )
        ON CONFLICT ("resource") DO UPDATE SET "last_token" = res."last_token" + 1
        RETURNING res."resource", res."last_token"
    )
    INSERT INTO "procbus_locks" AS l
        ("resource", "holder", "mode", "family", "token", "granted_at", "lease_expires_at")
    SELECT t."resource", "p_holder", "p_modes"[array_position("p_resources", t."resource")],
           coalesce("p_family", '{}'), t."last_token", clock_timestamp(), "lease"
    FROM "tokens" AS t
    RETURNING l."resource", l."mode", l."token", l."lease_expires_at", NULL::jsonb, '{}'::text[];
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT * FROM "procbus_lock_enqueue"("p_holder", "p_family", "p_resources", "p_modes", "lease");
    END IF;
    -- Which execution holds them: a waiter releases a closed workflow's locks (LockActivities).
    IF "p_execution" IS NOT NULL THEN
        UPDATE "procbus_locks" AS l SET "execution" = "p_execution"
        WHERE l."holder" = "p_holder" AND l."resource" = ANY ("p_resources")
          AND l."execution" IS DISTINCT FROM "p_execution";
    END IF;
END
$$;

-- Release every lock and queue place of a holder, then grant what that frees; with the
-- execution, its later requests are refused (procbus_lock_releases).
-- Returns the other holders that got a grant, so they can be told at once.
CREATE OR REPLACE FUNCTION "procbus_lock_release"("p_holder" text, "p_execution" text)
RETURNS SETOF text
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    "held" text[];
    "others_wait" boolean;
BEGIN
    IF "p_execution" IS NOT NULL THEN
        INSERT INTO "procbus_lock_releases" ("holder", "execution")
        VALUES ("p_holder", "p_execution") ON CONFLICT DO NOTHING;
    END IF;
    -- Each resource's queue is serialised (in one order) as it is read.
    SELECT array_agg(held_resource.r) INTO "held"
    FROM (
        SELECT l."resource" AS r, pg_advisory_xact_lock("procbus_lock_key"(l."resource"))
        FROM "procbus_locks" AS l WHERE l."holder" = "p_holder" ORDER BY l."resource"
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

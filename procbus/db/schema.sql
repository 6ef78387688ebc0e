-- The procbus schema as the migrations leave it, in one place to read: every table, index and
-- function as it is now. tests/integration/test_schema.py builds a database from this file and
-- one from the migrations and checks that they are the same. To change the schema, add a
-- migration (procbus/db/migrations/NNNN_name.sql), then bring this file up to date.

-- ---- stack checks (procbus/stack) ----

-- The round trips of the StackCheck workflow: proof that a worker reached the database.
CREATE TABLE "procbus_stack_checks" (
    "id" bigserial PRIMARY KEY,
    "check_id" text NOT NULL UNIQUE,
    "message" text NOT NULL,
    "worker" text NOT NULL,
    "written_at" timestamptz NOT NULL DEFAULT now()
);

-- ---- the lake catalog (procbus/lakehouse) ----

-- The lake catalog: namespaces hold tables; tables hold Parquet files under the warehouse.
-- "created_by" is the procedure that made the row: undo removes only what its procedure made.
CREATE TABLE "procbus_namespaces" (
    "name" text PRIMARY KEY,
    "properties" jsonb NOT NULL DEFAULT '{}',
    "created_by" text NOT NULL,
    "created_at" timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE "procbus_tables" (
    "namespace" text NOT NULL REFERENCES "procbus_namespaces" ("name"),
    "name" text NOT NULL,
    "columns" jsonb NOT NULL,
    "partition_by" text[] NOT NULL DEFAULT '{}',
    "properties" jsonb NOT NULL DEFAULT '{}',
    "location" text NOT NULL,
    "created_by" text NOT NULL,
    "created_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("namespace", "name")
);

CREATE TABLE "procbus_table_files" (
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "path" text NOT NULL,
    "records" bigint NOT NULL,
    "bytes" bigint NOT NULL,
    "added_by" text NOT NULL,
    "added_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("namespace", "table_name", "path"),
    FOREIGN KEY ("namespace", "table_name") REFERENCES "procbus_tables" ("namespace", "name")
        ON DELETE CASCADE
);

-- Events for delivery (TableCreated, ...); one per procedure and type, so a retry writes none.
CREATE TABLE "procbus_events" (
    "id" bigserial PRIMARY KEY,
    "procedure_id" text NOT NULL,
    "event_type" text NOT NULL,
    "namespace" text NOT NULL,
    "table_name" text,
    "payload" jsonb NOT NULL DEFAULT '{}',
    "created_at" timestamptz NOT NULL DEFAULT now(),
    UNIQUE ("procedure_id", "event_type")
);

-- ---- the durable outbox (procbus/hooks) ----

-- The durable outbox: Temporal calls decided inside a database transaction, performed after it
-- committed. A row exists only if its transaction committed; the relay marks it done.
CREATE TABLE "procbus_outbox" (
    "id" bigserial PRIMARY KEY,
    "kind" text NOT NULL CHECK ("kind" IN ('start_workflow', 'signal_workflow')),
    "workflow_id" text NOT NULL,
    "workflow_type" text,
    "signal_name" text,
    "task_queue" text,
    "payload" jsonb NOT NULL,
    "request_id" uuid NOT NULL UNIQUE,
    "created_at" timestamptz NOT NULL DEFAULT now(),
    "claimed_until" timestamptz,
    "attempts" integer NOT NULL DEFAULT 0,
    "last_error" text,
    "done_at" timestamptz,
    "run_id" text
);

-- The relay's work list: pending rows only, oldest first.
CREATE INDEX "procbus_outbox_pending" ON "procbus_outbox" ("id") WHERE "done_at" IS NULL;

-- ---- hierarchical locks (procbus/locks) ----

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
-- A holder's resources, in order: release reads them without a sort.
CREATE INDEX "procbus_locks_holder" ON "procbus_locks" ("holder", "resource");
-- Waiting requests only: "is anyone waiting here?" stays one probe when no one is.
CREATE INDEX "procbus_locks_waiting" ON "procbus_locks" ("resource", "queue_position")
WHERE "token" IS NULL;

-- The lock functions keep one plan per session, made of index probes (plan_cache_mode and the
-- scan settings): the lock table churns, and a plan made on an empty table would scan it whole.

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

-- The advisory lock key of a resource's queue.
CREATE FUNCTION "procbus_lock_key"("resource" text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('procbus_lock:' || "resource", 0)
$$;

-- Grant, in queue order, every waiting request on these resources that is compatible with the
-- granted ones and with every request queued before it (so readers never starve a writer).
-- The caller holds the resources' advisory locks (procbus_lock_key). Returns the holders that
-- got a grant.
CREATE FUNCTION "procbus_lock_grant"("p_resources" text[]) RETURNS SETOF text
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
CREATE FUNCTION "procbus_lock_enqueue"(
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
END
$$;

-- Release every lock and queue place of a holder, then grant what that frees.
-- Returns the other holders that got a grant, so they can be told at once.
CREATE FUNCTION "procbus_lock_release"("p_holder" text) RETURNS SETOF text
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

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
    "current_snapshot" bigint,
    -- Merge-on-read tables: the key their change files are merged by (empty: append only).
    "key_columns" text[] NOT NULL DEFAULT '{}',
    PRIMARY KEY ("namespace", "name")
);

CREATE TABLE "procbus_snapshots" (
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "snapshot_id" bigint NOT NULL,
    "parent_id" bigint,
    "operation" text NOT NULL CHECK ("operation" IN ('load', 'compact', 'apply')),
    "job_key" text NOT NULL,
    "procedure_id" text NOT NULL,
    "files_added" integer NOT NULL,
    "files_removed" integer NOT NULL,
    "records_added" bigint NOT NULL,
    "records_removed" bigint NOT NULL,
    "committed_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("namespace", "table_name", "snapshot_id"),
    FOREIGN KEY ("namespace", "table_name") REFERENCES "procbus_tables" ("namespace", "name")
        ON DELETE CASCADE
);

-- A file is live in snapshot S when added_in <= S and (removed_in IS NULL or removed_in > S):
-- one row per file, whatever the number of snapshots (snapshots of a table are a line).
CREATE TABLE "procbus_table_files" (
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "path" text NOT NULL,
    "partition" jsonb NOT NULL DEFAULT '{}',
    "records" bigint NOT NULL,
    "bytes" bigint NOT NULL,
    "added_in" bigint NOT NULL,
    "removed_in" bigint,
    -- 'changes': each key's newest row image of a batch and a deleted flag (merge-on-read).
    "kind" text NOT NULL DEFAULT 'data' CHECK ("kind" IN ('data', 'changes')),
    PRIMARY KEY ("namespace", "table_name", "path"),
    FOREIGN KEY ("namespace", "table_name") REFERENCES "procbus_tables" ("namespace", "name")
        ON DELETE CASCADE
);
CREATE INDEX "procbus_table_files_live" ON "procbus_table_files" ("namespace", "table_name")
    WHERE "removed_in" IS NULL;

-- The Spark job ledger: one row per job (its business key), one attempt token per attempt.
-- Only the current attempt may commit; the commit records the snapshot, so a retried commit
-- whose outcome was unknown finds it here.
CREATE TABLE "procbus_spark_jobs" (
    "job_key" text PRIMARY KEY,
    "procedure_id" text NOT NULL,
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "attempt" integer NOT NULL,
    "attempt_token" text NOT NULL,
    "state" text NOT NULL CHECK ("state" IN ('running', 'staged', 'committed', 'failed', 'cancelled')),
    "snapshot_id" bigint,
    "error" text,
    "started_at" timestamptz NOT NULL DEFAULT now(),
    "updated_at" timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE "procbus_spark_attempts" (
    "job_key" text NOT NULL REFERENCES "procbus_spark_jobs" ("job_key") ON DELETE CASCADE,
    "attempt" integer NOT NULL,
    "attempt_token" text NOT NULL UNIQUE,
    "worker" text NOT NULL,
    "started_at" timestamptz NOT NULL DEFAULT now(),
    -- On a cluster: the run's submission ID and output folder, so a new worker reattaches.
    "submission_id" text,
    "output" text,
    PRIMARY KEY ("job_key", "attempt")
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

-- Table permissions, the durable truth behind every worker's ACL cache. A deleted table takes
-- its grants with it: a table created again under that name starts with none. `admin` may grant
-- and revoke on the table.
CREATE TABLE "procbus_acl" (
    "principal" text NOT NULL,
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "permission" text NOT NULL CHECK ("permission" IN ('read', 'write', 'admin')),
    "granted_by" text NOT NULL,
    "granted_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("principal", "namespace", "table_name", "permission"),
    FOREIGN KEY ("namespace", "table_name") REFERENCES "procbus_tables" ("namespace", "name")
        ON DELETE CASCADE
);

-- Grants on a namespace: a permission on every table in it, now and later (shown and granted
-- as 'NAMESPACE.*'); `admin` may grant and revoke on the namespace and on its tables. A deleted
-- namespace takes its grants with it; its creator gets admin with it.
CREATE TABLE "procbus_namespace_acl" (
    "principal" text NOT NULL,
    "namespace" text NOT NULL REFERENCES "procbus_namespaces" ("name") ON DELETE CASCADE,
    "permission" text NOT NULL CHECK ("permission" IN ('read', 'write', 'admin')),
    "granted_by" text NOT NULL,
    "granted_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("principal", "namespace", "permission")
);

-- ---- the notification bus (procbus/bus) ----

-- Bus member incarnations: never reused, also after a forgotten member row is made again.
CREATE SEQUENCE "procbus_bus_incarnations";

-- The notification bus's members: one row per worker process, kept alive by its heartbeat.
-- Each member states its own timeout: it counts as gone once its heartbeat is older.
CREATE TABLE "procbus_bus_members" (
    "member_id" text PRIMARY KEY,
    "task_queue" text NOT NULL,
    "host" text NOT NULL,
    "pid" integer NOT NULL,
    "started_at" timestamptz NOT NULL DEFAULT now(),
    "heartbeat_at" timestamptz NOT NULL DEFAULT now(),
    "timeout_seconds" double precision NOT NULL CHECK ("timeout_seconds" > 0),
    -- The process holding the ID: a new one takes a new incarnation and fences the one before.
    "incarnation" bigint NOT NULL DEFAULT nextval('"procbus_bus_incarnations"')
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

-- ---- persistent topics (procbus/topics) ----

CREATE TABLE "procbus_topics" (
    "name" text PRIMARY KEY,
    "endpoint" text NOT NULL,
    "sync" boolean NOT NULL DEFAULT false,
    "max_entries" bigint NOT NULL CHECK ("max_entries" > 0),
    "max_bytes" bigint NOT NULL CHECK ("max_bytes" > 0),
    "max_retries" integer NOT NULL CHECK ("max_retries" >= 0),
    "retry_sleep_seconds" double precision NOT NULL CHECK ("retry_sleep_seconds" > 0),
    "ttl_seconds" double precision NOT NULL CHECK ("ttl_seconds" > 0),
    "batch_size" integer NOT NULL CHECK ("batch_size" > 0 AND "batch_size" <= 10000),
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
    "created_at" timestamptz NOT NULL DEFAULT now(),
    -- Synchronous topics: sends the endpoint did not acknowledge.
    "nacked" bigint NOT NULL DEFAULT 0,
    -- Grouped topics: how long a transaction's missing events are waited for before the rest
    -- goes without them, and how many batches went out so.
    "incomplete_wait_seconds" double precision NOT NULL DEFAULT 60
        CHECK ("incomplete_wait_seconds" > 0),
    "incomplete_batches" bigint NOT NULL DEFAULT 0,
    -- Grouped topics: a batch shorter than batch_size waits until its oldest event is this old.
    "batch_seconds" double precision NOT NULL DEFAULT 0 CHECK ("batch_seconds" >= 0),
    -- The epoch of the topic's delivery owner: each take-over by a new owner bumps it, and an
    -- attempt of an older epoch claims, settles and commits nothing (procbus_topic_hold).
    "owner_epoch" bigint NOT NULL DEFAULT 0
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
-- committed and reserved). The shards' bounds add up to the topic's. Whoever changes a shard's
-- counts holds its advisory lock (procbus_topic_shard_lock), which a publisher tries and others
-- wait for; the counts carry no CHECK, which PostgreSQL would prepare again on every publish.
CREATE TABLE "procbus_topic_shards" (
    "topic" text NOT NULL,
    "shard" integer NOT NULL,
    "entries" bigint NOT NULL DEFAULT 0,
    "bytes" bigint NOT NULL DEFAULT 0,
    "max_entries" bigint NOT NULL,
    "max_bytes" bigint NOT NULL,
    -- Copies of the topic's settings, for a publish without a topic lookup (it is no
    -- synchronous topic, the payload fits, the transaction fields are kept).
    "queues" boolean NOT NULL,
    "max_payload_bytes" bigint NOT NULL,
    "grouped" boolean NOT NULL,
    PRIMARY KEY ("topic", "shard")
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
    "expires_at" timestamptz NOT NULL,
    -- The server process whose session took it, and the transaction that session had open after
    -- it expired, which its end waits for (see migration 0020).
    "owner_pid" integer NOT NULL DEFAULT pg_backend_pid(),
    "waiting_for" text
);
CREATE INDEX "procbus_topic_leases_expiry" ON "procbus_topic_leases" ("topic", "expires_at");

-- Committed events waiting for delivery. "id" is queue order; publishers of one key are
-- serialised, so for each key it is commit order. Retry state lives with the entry.
CREATE TABLE "procbus_topic_entries" (
    "id" bigserial NOT NULL,
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
    "txn_id" text,
    "txn_last" boolean NOT NULL DEFAULT false,
    "txn_size" integer,
    -- The batch an entry was first sent in, and its place there: it is resent in that batch
    -- until acknowledged or dead-lettered.
    "batch_id" text,
    "batch_seq" integer,
    -- The lease an entry was queued under, if any (procbus_topic_leases).
    "lease" bigint,
    PRIMARY KEY ("topic", "id")
);
CREATE INDEX "procbus_topic_entries_key" ON "procbus_topic_entries" ("topic", "key", "id")
WHERE "key" IS NOT NULL;
CREATE INDEX "procbus_topic_entries_txn" ON "procbus_topic_entries" ("topic", "txn_id", "id")
WHERE "txn_id" IS NOT NULL;
CREATE INDEX "procbus_topic_entries_batch" ON "procbus_topic_entries" ("topic", "id")
WHERE "batch_id" IS NOT NULL;

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
    "reason" text NOT NULL,
    "txn_id" text,
    "txn_last" boolean NOT NULL DEFAULT false,
    "txn_size" integer,
    "batch_id" text
);
CREATE INDEX "procbus_topic_dead_letters_topic" ON "procbus_topic_dead_letters" ("topic", "id");

-- A topic's delivery claim: the one attempt that may settle what it sent. A new claim replaces
-- the row (one owner per topic), fencing out an older, overlapping attempt. Unlogged: a fence
-- between live attempts, not data (empty after a database crash: every attempt claims again).
-- "epoch": the owner epoch of the attempt that holds it; a take-over leaves its new epoch here
-- with no claim, so that an older attempt's hold racing it is refused (procbus_topic_hold).
CREATE UNLOGGED TABLE "procbus_topic_claims" (
    "topic" text PRIMARY KEY REFERENCES "procbus_topics" ("name") ON DELETE CASCADE,
    "claim" uuid,
    "claimed_at" timestamptz NOT NULL DEFAULT clock_timestamp(),
    "epoch" bigint NOT NULL DEFAULT 0
);

-- A grouped topic's batches as assembled, one row each (entries in send order), until their
-- claim is settled: then a batch sent and not acknowledged is written onto its entries.
CREATE TABLE "procbus_topic_batches" (
    "topic" text NOT NULL REFERENCES "procbus_topics" ("name") ON DELETE CASCADE,
    "batch_id" text NOT NULL,
    "entry_ids" bigint[] NOT NULL,
    PRIMARY KEY ("topic", "batch_id")
);

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
CREATE FUNCTION "procbus_topic_end_leases"(
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

-- Take capacity for one event of "p_bytes" from a shard of "p_topic", the caller's own shard
-- first; returns the shard, or NULL when the topic is full. A shard whose lock another
-- publisher holds is skipped rather than waited for; only when all are busy does it wait. Expired
-- reservations give their capacity back before a topic is called full.
CREATE FUNCTION "procbus_topic_take"("p_topic" text, "p_shard" integer, "p_bytes" bigint)
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

-- Give back the capacity of "p_topic"'s expired reservations (their owners died), and end its
-- expired leases when their shards are free; how many reservations.
CREATE FUNCTION "procbus_topic_reclaim"("p_topic" text) RETURNS integer
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
CREATE FUNCTION "procbus_topic_admit"(
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
CREATE FUNCTION "procbus_topic_publish"(
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
CREATE FUNCTION "procbus_topic_commit"(
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
CREATE FUNCTION "procbus_topic_keep_batches"("p_topic" text, "p_kept" text[], "p_settled" text[] DEFAULT NULL)
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
CREATE FUNCTION "procbus_topic_view"(
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
    PERFORM "procbus_topic_give_back"(
        "held"."topic", ARRAY["held"."shard"], ARRAY[1::bigint], ARRAY["held"."bytes"]);
    RETURN true;
END
$$;

-- A delivery attempt's batch, in queue order: entries due and not behind an earlier entry of
-- the same key that waits for its retry (only that key waits). The claim becomes the topic's
-- one claim when it holds anything (an idle topic's look writes nothing). Index probes in queue
-- order, whatever the table's statistics say: a freshly filled queue looks tiny to the planner.
CREATE FUNCTION "procbus_topic_claim"(
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
CREATE FUNCTION "procbus_topic_hold"("p_topic" text, "p_claim" uuid, "p_epoch" bigint)
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
-- pydantic writes it. A single expression, so PostgreSQL inlines it into the statement.
CREATE FUNCTION "procbus_topic_event_json"(
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

-- ---- change capture (procbus/capture) and the change pipeline (procbus/pipeline) ----

CREATE TABLE "procbus_captures" (
    "source_schema" text NOT NULL,
    "source_table" text NOT NULL,
    -- No cascade: a topic carrying captures is not deleted from under the application's writes.
    "topic" text NOT NULL REFERENCES "procbus_topics" ("name"),
    "key_columns" text[] NOT NULL,
    "trigger_name" text NOT NULL,
    "snapshot_rows" bigint NOT NULL DEFAULT 0,
    "created_at" timestamptz NOT NULL DEFAULT now(),
    -- The source's columns when the capture began (NULL: a capture made before they were kept);
    -- one added since is a change of schema the pipeline applies to the lake table.
    "source_columns" text[],
    PRIMARY KEY ("source_schema", "source_table", "topic")
);

-- A capturing transaction's topics, while it runs: a row per (transaction, topic), removed by
-- the deferred trigger at commit (so the table is empty between transactions).
CREATE TABLE "procbus_capture_open" (
    "txn_id" text NOT NULL,
    "topic" text NOT NULL,
    PRIMARY KEY ("txn_id", "topic")
);

-- One change of one row, published into "p_topic" in the caller's transaction. The event's key
-- is the table and the row's key, so a key's changes are delivered in commit order (publishers
-- of a key are serialised by procbus_topic_publish). Its transaction is the database's own.
CREATE FUNCTION "procbus_capture_publish"(
    "p_topic" text,
    "p_schema" text,
    "p_table" text,
    "p_keys" text[],
    "p_op" text,
    "p_image" jsonb
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    "key_value" jsonb := (SELECT jsonb_object_agg(k, "p_image" -> k) FROM unnest("p_keys") AS k);
    "txn" text := 'pg_' || pg_current_xact_id()::text;
BEGIN
    PERFORM "procbus_topic_publish"(
        "p_topic",
        pg_backend_pid() % 16,
        "p_schema" || '.' || "p_table" || '/' || "key_value"::text,
        'change',
        jsonb_build_object(
            'op', "p_op", 'schema', "p_schema", 'table', "p_table", 'key', "key_value",
            'row', CASE WHEN "p_op" = 'delete' THEN NULL ELSE "p_image" END
        )::text,
        'msg_' || replace(gen_random_uuid()::text, '-', ''),
        "txn",
        false,
        NULL
    );
    INSERT INTO "procbus_capture_open" ("txn_id", "topic") VALUES ("txn", "p_topic")
    ON CONFLICT DO NOTHING;
END
$$;

-- The row trigger: TG_ARGV holds the topic, the captured table's schema and name (a partitioned
-- table's, not the partition's), then the key columns. An UPDATE that changes the key is the old
-- key's delete and the new key's insert.
CREATE FUNCTION "procbus_capture_change"() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    "keys" text[] := TG_ARGV[3:];
    "old_image" jsonb;
    "new_image" jsonb;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM "procbus_capture_publish"(TG_ARGV[0], TG_ARGV[1], TG_ARGV[2], "keys", 'delete', to_jsonb(OLD));
        RETURN NULL;
    END IF;
    "new_image" := to_jsonb(NEW);
    IF TG_OP = 'UPDATE' THEN
        "old_image" := to_jsonb(OLD);
        IF EXISTS (SELECT FROM unnest("keys") AS k WHERE "old_image" -> k IS DISTINCT FROM "new_image" -> k) THEN
            PERFORM "procbus_capture_publish"(TG_ARGV[0], TG_ARGV[1], TG_ARGV[2], "keys", 'delete', "old_image");
            PERFORM "procbus_capture_publish"(TG_ARGV[0], TG_ARGV[1], TG_ARGV[2], "keys", 'insert', "new_image");
            RETURN NULL;
        END IF;
    END IF;
    PERFORM "procbus_capture_publish"(TG_ARGV[0], TG_ARGV[1], TG_ARGV[2], "keys", lower(TG_OP), "new_image");
    RETURN NULL;
END
$$;

-- At commit: the transaction's last event on the topic is marked, with the event count.
CREATE FUNCTION "procbus_capture_commit"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE "procbus_topic_entries" AS e SET "txn_last" = true, "txn_size" = c."size"
    FROM (
        SELECT max(t."id") AS "last", count(*)::integer AS "size"
        FROM "procbus_topic_entries" AS t
        WHERE t."topic" = NEW."topic" AND t."txn_id" = NEW."txn_id"
    ) AS c
    WHERE e."id" = c."last";
    DELETE FROM "procbus_capture_open" WHERE "txn_id" = NEW."txn_id" AND "topic" = NEW."topic";
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER "procbus_capture_commit" AFTER INSERT ON "procbus_capture_open"
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "procbus_capture_commit"();

CREATE FUNCTION "procbus_capture_refuse_truncate"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'table %.% is captured into topic %: TRUNCATE would not be captured; DELETE the rows, or delete the capture first',
        TG_TABLE_SCHEMA, TG_TABLE_NAME, quote_literal(TG_ARGV[0]) USING ERRCODE = 'PBC01';
END
$$;

-- Start capturing "p_table" into "p_topic": the trigger, then every row already there published
-- as an insert, in the caller's transaction. CREATE TRIGGER takes a lock that waits for the
-- table's running writers and holds off new ones until commit, so no change falls between the
-- snapshot and the trigger, and none is in both. Returns the rows published.
CREATE FUNCTION "procbus_capture_attach"(
    "p_table" regclass,
    "p_topic" text,
    "p_keys" text[],
    "p_trigger" text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    "schema_name" text;
    "table_name" text;
    "published" bigint;
BEGIN
    SELECT n."nspname", c."relname" INTO "schema_name", "table_name"
    FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n."oid" = c."relnamespace"
    WHERE c."oid" = "p_table";
    EXECUTE format(
        'CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW '
        'EXECUTE FUNCTION "procbus_capture_change"(%s)',
        "p_trigger", "p_table",
        (SELECT string_agg(quote_literal(a), ', ')
         FROM unnest(ARRAY["p_topic", "schema_name", "table_name"] || "p_keys") AS a)
    );
    -- TRUNCATE fires no row trigger: refused, so no change goes uncaptured.
    EXECUTE format(
        'CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT '
        'EXECUTE FUNCTION "procbus_capture_refuse_truncate"(%L)',
        "p_trigger" || '_truncate', "p_table", "p_topic"
    );
    EXECUTE format(
        'SELECT count(*) FROM %s AS r, '
        'LATERAL "procbus_capture_publish"($1, $2, $3, $4, ''insert'', to_jsonb(r)) AS p',
        "p_table"
    ) INTO "published" USING "p_topic", "schema_name", "table_name", "p_keys";
    RETURN "published";
END
$$;

-- Stop capturing: the trigger goes (nothing to do when the table is gone already).
CREATE FUNCTION "procbus_capture_detach"("p_schema" text, "p_table" text, "p_trigger" text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass(format('%I.%I', "p_schema", "p_table")) IS NOT NULL THEN
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I.%I', "p_trigger", "p_schema", "p_table");
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I.%I', "p_trigger" || '_truncate', "p_schema", "p_table");
    END IF;
END
$$;

-- A topic whose endpoint is table://: where its changes have reached the lake.
CREATE TABLE "procbus_pipelines" (
    "topic" text PRIMARY KEY REFERENCES "procbus_topics" ("name") ON DELETE CASCADE,
    -- The queue position (entry ID) of the newest change applied; per key, commit order.
    "position" bigint NOT NULL DEFAULT 0,
    "batches_applied" bigint NOT NULL DEFAULT 0,
    "changes_applied" bigint NOT NULL DEFAULT 0,
    "transactions_applied" bigint NOT NULL DEFAULT 0,
    -- When the newest change applied was committed at the source, and when it was applied.
    "source_committed_at" timestamptz,
    "applied_at" timestamptz,
    "last_error" text,
    "last_error_at" timestamptz
);

-- Every batch applied, by its ID: a second apply of one finds it here and commits nothing. Kept
-- a day after its batch left the queue (no attempt can send it again after that).
CREATE TABLE "procbus_pipeline_batches" (
    "topic" text NOT NULL REFERENCES "procbus_pipelines" ("topic") ON DELETE CASCADE,
    "batch_id" text NOT NULL,
    "changes" integer NOT NULL,
    "snapshots" jsonb NOT NULL,
    "applied_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("topic", "batch_id")
);
-- Old fence rows are forgotten by age (procbus_pipeline_batches is pruned on each commit).
CREATE INDEX "procbus_pipeline_batches_age" ON "procbus_pipeline_batches" ("topic", "applied_at");

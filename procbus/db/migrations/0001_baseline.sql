-- The baseline: every table, sequence and index of procbus, as the 26 migrations before it
-- left them (squashed into this one file). Functions and the triggers that call them live beside
-- their mechanism (procbus/<mechanism>/functions.sql), applied after the numbered migrations.
-- Never edit this file once released: a table change is a new migration, 0002_name.sql, ...

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
-- A table's data is a chain of snapshots; its current one changes only by a catalog commit, a
-- compare-and-set of "current_snapshot" (NULL: no data yet).
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

-- ---- principals (procbus/auth) ----

-- Each principal token starts one run: the first run that presents it claims it here, and a
-- start that copies it from a history (any `temporal` CLI user may read one) is refused, also
-- under the same workflow ID once the first run has closed.
CREATE TABLE "procbus_principal_token_uses" (
    "token_mac" text PRIMARY KEY,
    "workflow_id" text NOT NULL,
    "run_id" text NOT NULL,
    "expires_at" timestamptz NOT NULL,
    "used_at" timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX "procbus_principal_token_uses_expiry" ON "procbus_principal_token_uses" ("expires_at");

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
    -- it expired, which its end waits for (procbus_topic_end_leases).
    "owner_pid" integer NOT NULL DEFAULT pg_backend_pid(),
    "waiting_for" text
);
CREATE INDEX "procbus_topic_leases_expiry" ON "procbus_topic_leases" ("topic", "expires_at");

-- Committed events waiting for delivery. "id" is queue order; publishers of one key are
-- serialised, so for each key it is commit order. Retry state lives with the entry. The key is
-- ("topic", "id"), so the one index in queue order is the topic's own: a look reads only its own
-- topic's queue, whatever the statistics say (through the primary key on "id" alone, a look
-- read the older entries of other topics to find its head: 27 ms against 0.9 ms).
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

-- ---- change capture (procbus/capture) and the change pipeline (procbus/pipeline) ----

-- Capture: a row trigger on an application's table publishes each change into a grouped topic's
-- queue, in the application's own transaction (a rolled-back transaction publishes nothing).
-- Apply: merge-on-read lake tables. A batch of changes is written as one file per lake table
-- holding each key's last row image and a deleted flag; a reader takes, per key, the row of the
-- newest file (compaction folds them). The batch ID recorded with the catalog commit fences out
-- a second apply of the same batch.

-- A captured table, and the topic its changes go to.
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

-- A table's data is a chain of snapshots; its current one changes only by a catalog commit,
-- a compare-and-set of "current_snapshot" (NULL: no data yet).
ALTER TABLE "procbus_tables" ADD COLUMN "current_snapshot" bigint;

CREATE TABLE "procbus_snapshots" (
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "snapshot_id" bigint NOT NULL,
    "parent_id" bigint,
    "operation" text NOT NULL CHECK ("operation" IN ('load', 'compact')),
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
DROP TABLE "procbus_table_files";
CREATE TABLE "procbus_table_files" (
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "path" text NOT NULL,
    "partition" jsonb NOT NULL DEFAULT '{}',
    "records" bigint NOT NULL,
    "bytes" bigint NOT NULL,
    "added_in" bigint NOT NULL,
    "removed_in" bigint,
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

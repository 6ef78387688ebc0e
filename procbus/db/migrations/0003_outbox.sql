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

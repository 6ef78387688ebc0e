-- The notification bus's members: one row per worker process, kept alive by its heartbeat.
-- Each member states its own timeout: it counts as gone once its heartbeat is older.
CREATE TABLE "procbus_bus_members" (
    "member_id" text PRIMARY KEY,
    "task_queue" text NOT NULL,
    "host" text NOT NULL,
    "pid" integer NOT NULL,
    "started_at" timestamptz NOT NULL DEFAULT now(),
    "heartbeat_at" timestamptz NOT NULL DEFAULT now(),
    "timeout_seconds" double precision NOT NULL CHECK ("timeout_seconds" > 0)
);

-- Table permissions, the durable truth behind every worker's ACL cache. A deleted table takes
-- its grants with it: a table created again under that name starts with none.
CREATE TABLE "procbus_acl" (
    "principal" text NOT NULL,
    "namespace" text NOT NULL,
    "table_name" text NOT NULL,
    "permission" text NOT NULL CHECK ("permission" IN ('read', 'write')),
    "granted_by" text NOT NULL,
    "granted_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("principal", "namespace", "table_name", "permission"),
    FOREIGN KEY ("namespace", "table_name") REFERENCES "procbus_tables" ("namespace", "name")
        ON DELETE CASCADE
);

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

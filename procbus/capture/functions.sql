-- The functions and triggers of change capture (procbus/capture): applied by migrate() after the
-- numbered migrations, and again whenever this file changes. Every statement must be safe to run
-- again over what it made (CREATE OR REPLACE). A function that leaves this file is dropped by a
-- numbered migration (DROP FUNCTION), as is one whose arguments or result type change (then made
-- anew here).

-- A row trigger on an application's table publishes each change into a grouped topic's queue,
-- in the application's own transaction; a deferred constraint trigger, run once per
-- (transaction, topic) at commit, marks the transaction's last event with its event count.

-- One change of one row, published into "p_topic" in the caller's transaction. The event's key
-- is the table and the row's key, so a key's changes are delivered in commit order (publishers
-- of a key are serialised by procbus_topic_publish). Its transaction is the database's own.
CREATE OR REPLACE FUNCTION "procbus_capture_publish"(
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
CREATE OR REPLACE FUNCTION "procbus_capture_change"() RETURNS trigger
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
CREATE OR REPLACE FUNCTION "procbus_capture_commit"() RETURNS trigger
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

-- A constraint trigger has no CREATE OR REPLACE: made anew, in migrate()'s transaction.
DROP TRIGGER IF EXISTS "procbus_capture_commit" ON "procbus_capture_open";
CREATE CONSTRAINT TRIGGER "procbus_capture_commit" AFTER INSERT ON "procbus_capture_open"
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "procbus_capture_commit"();

CREATE OR REPLACE FUNCTION "procbus_capture_refuse_truncate"() RETURNS trigger
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
CREATE OR REPLACE FUNCTION "procbus_capture_attach"(
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
CREATE OR REPLACE FUNCTION "procbus_capture_detach"("p_schema" text, "p_table" text, "p_trigger" text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass(format('%I.%I', "p_schema", "p_table")) IS NOT NULL THEN
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I.%I', "p_trigger", "p_schema", "p_table");
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I.%I', "p_trigger" || '_truncate', "p_schema", "p_table");
    END IF;
END
$$;

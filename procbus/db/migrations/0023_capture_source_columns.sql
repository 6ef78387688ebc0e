-- Schema changes of captured tables (issue 34): a capture keeps its source's columns as they were
-- when it began, so the pipeline tells a column added since (a change of schema, added to the
-- lake table) from one the lake table was made without (refused, as before).
ALTER TABLE "procbus_captures" ADD COLUMN "source_columns" text[];

-- A topic fills up when its delivery stopped (a change pipeline refusing a change of schema,
-- say): the application write it then refuses is told why.
CREATE OR REPLACE FUNCTION "procbus_topic_admit"(
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

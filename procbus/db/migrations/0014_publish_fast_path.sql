-- What a publisher must know of its topic, kept on each shard row it takes capacity from, so
-- that a publish is one statement with no topic lookup: the UPDATE of the caller's own shard
-- (when it is free and has room) and the INSERT of the entry (procbus/topics/queries.sql,
-- publish). Anything else goes through procbus_topic_publish. A topic's settings never change
-- after it is created, so the copies cannot drift.

ALTER TABLE "procbus_topic_shards"
    ADD COLUMN "queues" boolean NOT NULL DEFAULT true,
    ADD COLUMN "max_payload_bytes" bigint NOT NULL DEFAULT 0,
    ADD COLUMN "grouped" boolean NOT NULL DEFAULT false;

UPDATE "procbus_topic_shards" AS s
SET "queues" = NOT t."sync", "max_payload_bytes" = t."max_payload_bytes",
    "grouped" = t."group_transactions"
FROM "procbus_topics" AS t
WHERE t."name" = s."topic";

ALTER TABLE "procbus_topic_shards"
    ALTER COLUMN "queues" DROP DEFAULT,
    ALTER COLUMN "max_payload_bytes" DROP DEFAULT,
    ALTER COLUMN "grouped" DROP DEFAULT;

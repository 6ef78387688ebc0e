-- A delivery round holds at most 10,000 entries (procbus.topics.models.MAX_BATCH_SIZE): a
-- topic created with more before the bound existed takes the most there is now.
UPDATE "procbus_topics" SET "batch_size" = 10000 WHERE "batch_size" > 10000;
ALTER TABLE "procbus_topics" DROP CONSTRAINT "procbus_topics_batch_size_check";
ALTER TABLE "procbus_topics" ADD CONSTRAINT "procbus_topics_batch_size_check"
    CHECK ("batch_size" > 0 AND "batch_size" <= 10000);

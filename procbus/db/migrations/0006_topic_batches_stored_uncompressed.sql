-- A grouped topic's assembled batches live only until their claim is settled, and a row holds up
-- to 10,000 entry IDs: compressing them (pglz) was most of a claim's assign_batches (131 ms for
-- eight batches of 10,000, against 3 ms stored as they are, out of line).
ALTER TABLE "procbus_topic_batches" ALTER COLUMN "entry_ids" SET STORAGE EXTERNAL;

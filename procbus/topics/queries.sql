-- name: insert_topic
INSERT INTO "procbus_topics"
    ("name", "endpoint", "sync", "max_entries", "max_bytes", "max_retries", "retry_sleep_seconds",
     "ttl_seconds", "batch_size", "group_transactions", "shards", "max_payload_bytes",
     "batch_seconds", "incomplete_wait_seconds")
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT ("name") DO NOTHING
RETURNING "name";

-- name: insert_shards
-- The topic's bounds split over its shards: the first ones take the remainder, so they add up.
INSERT INTO "procbus_topic_shards"
    ("topic", "shard", "max_entries", "max_bytes", "queues", "max_payload_bytes", "grouped")
SELECT $1, s, $2::bigint / $4 + CASE WHEN s < $2::bigint % $4 THEN 1 ELSE 0 END,
       $3::bigint / $4 + CASE WHEN s < $3::bigint % $4 THEN 1 ELSE 0 END, $5, $6, $7
FROM generate_series(0, $4 - 1) AS s;

-- name: insert_secret
INSERT INTO "procbus_topic_secrets" ("topic", "secret") VALUES ($1, $2);

-- name: retire_secrets
-- A rotation: the current secrets keep signing until $2, beside the new one.
UPDATE "procbus_topic_secrets" SET "retired_at" = clock_timestamp() + make_interval(secs => $2)
WHERE "topic" = $1 AND "retired_at" IS NULL;

-- name: drop_retired_secrets
DELETE FROM "procbus_topic_secrets" WHERE "topic" = $1 AND "retired_at" < clock_timestamp();

-- name: signing_secrets
SELECT "secret" FROM "procbus_topic_secrets"
WHERE "topic" = $1 AND ("retired_at" IS NULL OR "retired_at" > clock_timestamp())
ORDER BY "created_at" DESC;

-- name: get_topic
SELECT "name", "endpoint", "sync", "max_entries", "max_bytes", "max_retries",
       "retry_sleep_seconds", "ttl_seconds", "batch_size", "group_transactions", "shards",
       "batch_seconds", "incomplete_wait_seconds", "disabled_at", "disabled_reason", "delivered",
       "retried", "dead_lettered", "nacked", "incomplete_batches", "created_at"
FROM "procbus_topics" WHERE "name" = $1;

-- name: list_topics
SELECT "name", "endpoint", "sync", "max_entries", "max_bytes", "max_retries",
       "retry_sleep_seconds", "ttl_seconds", "batch_size", "group_transactions", "shards",
       "batch_seconds", "incomplete_wait_seconds", "disabled_at", "disabled_reason", "delivered",
       "retried", "dead_lettered", "nacked", "incomplete_batches", "created_at"
FROM "procbus_topics" ORDER BY "name";

-- name: lock_topic_for_delete
SELECT "name" FROM "procbus_topics" WHERE "name" = $1 FOR UPDATE;

-- name: captures_into
-- The application tables captured into a topic (procbus.capture), or NULL.
SELECT string_agg("source_schema" || '.' || "source_table", ', ' ORDER BY "source_table")
FROM "procbus_captures" WHERE "topic" = $1;

-- name: count_pending
SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1;

-- name: delete_topic_leases
-- Before a topic's entries go: its leases, once those of live sessions expired and the
-- transactions they had open then ended (waited for at most $3 seconds), so that no entry they
-- queue outlives the topic; this session's own ($2, the topic's lease setting) disarmed instead.
SELECT "procbus_topic_delete_leases"($1, $2, $3);

-- name: lock_topic_shards
-- Before a topic's shards go: their locks, in shard order, as every writer of their counts
-- takes them (procbus_topic_give_back).
SELECT pg_advisory_xact_lock("procbus_topic_shard_lock"($1, s."shard"))
FROM "procbus_topic_shards" AS s WHERE s."topic" = $1
ORDER BY s."shard";

-- name: lock_topic_reservations
-- And their reservations' rows, which a reservation's commit deletes as it queues its event: one
-- committing now is waited for (and counted), and none commits after this.
SELECT 1 FROM "procbus_topic_reservations" WHERE "topic" = $1 FOR UPDATE;

-- name: delete_topic_rows
-- Everything of a topic but its row (its secrets go with it by the foreign key).
WITH "entries" AS (DELETE FROM "procbus_topic_entries" WHERE "topic" = $1),
     "reservations" AS (DELETE FROM "procbus_topic_reservations" WHERE "topic" = $1),
     "dead" AS (DELETE FROM "procbus_topic_dead_letters" WHERE "topic" = $1)
DELETE FROM "procbus_topic_shards" WHERE "topic" = $1;

-- name: delete_topic
DELETE FROM "procbus_topics" WHERE "name" = $1;

-- name: set_disabled
UPDATE "procbus_topics" SET "disabled_at" = clock_timestamp(), "disabled_reason" = $2
WHERE "name" = $1;

-- name: lock_topic_state
SELECT "endpoint", "disabled_at" FROM "procbus_topics" WHERE "name" = $1 FOR UPDATE;

-- name: first_entry_batch
-- The batch the first entry of the queue was sent in (NULL: it was sent in none, or none waits).
SELECT "batch_id" FROM "procbus_topic_entries" WHERE "topic" = $1 ORDER BY "id" LIMIT 1;

-- name: batch_entry_ids
SELECT coalesce(array_agg("id" ORDER BY "id"), '{}') FROM "procbus_topic_entries"
WHERE "topic" = $1 AND "batch_id" = $2;

-- name: pipeline_position
-- A table:// topic's position: the newest entry its pipeline applied (procbus.pipeline).
SELECT "position" FROM "procbus_pipelines" WHERE "topic" = $1;

-- name: set_enabled
UPDATE "procbus_topics" SET "disabled_at" = NULL, "disabled_reason" = NULL
WHERE "name" = $1 RETURNING "name";

-- name: publish
-- A publish in one statement, when the caller's own shard is free and has room: its capacity,
-- then the key's lock, then the entry (its ID drawn after the lock, so one key's IDs follow its
-- commits). No row means nothing was done (a busy or full shard; an unknown or synchronous
-- topic; a payload too large): then publish_checked decides, and says what was wrong. The
-- entry's txn_id is the event's on a grouped topic, else NULL.
WITH "taken" AS (
    UPDATE "procbus_topic_shards" AS s
    SET "entries" = s."entries" + 1, "bytes" = s."bytes" + octet_length($5)
    WHERE s."topic" = $1 AND s."shard" = $2 AND s."queues"
      AND octet_length($5) <= s."max_payload_bytes"
      AND s."entries" < s."max_entries" AND s."bytes" + octet_length($5) <= s."max_bytes"
      -- The shard's lock, tried: a shard another publisher holds is skipped, not waited for.
      AND pg_try_advisory_xact_lock("procbus_topic_shard_lock"($1, $2))
      -- The key's lock as a filter of this row, cheaper than a step of its own
      -- (pg_advisory_xact_lock returns void, which casts to the empty text).
      AND ($3::text IS NULL OR pg_advisory_xact_lock(
          hashtextextended('procbus_topic_key:' || $1 || '/' || $3::text, 0))::text = '')
    RETURNING s."shard", s."grouped"
)
INSERT INTO "procbus_topic_entries"
    ("topic", "shard", "key", "type", "payload", "bytes", "webhook_id", "txn_id", "txn_last",
     "txn_size")
SELECT $1, k."shard", $3, $4, $5::jsonb, octet_length($5), $6,
       CASE WHEN k."grouped" THEN $7::text END, k."grouped" AND coalesce($8::boolean, false),
       CASE WHEN k."grouped" THEN $9::integer END
FROM "taken" AS k
RETURNING "id", "created_at", "txn_id";

-- name: publish_plain
-- publish for an event without a key or transaction fields ($1 topic, $2 shard, $3 type,
-- $4 payload, $5 webhook ID): PostgreSQL prepares a statement's expressions again on every
-- run, and most events need neither the key's lock nor the CASEs.
WITH "taken" AS (
    UPDATE "procbus_topic_shards" AS s
    SET "entries" = s."entries" + 1, "bytes" = s."bytes" + octet_length($4)
    WHERE s."topic" = $1 AND s."shard" = $2 AND s."queues"
      AND octet_length($4) <= s."max_payload_bytes"
      AND s."entries" < s."max_entries" AND s."bytes" + octet_length($4) <= s."max_bytes"
      AND pg_try_advisory_xact_lock("procbus_topic_shard_lock"($1, $2))
    RETURNING s."shard"
)
INSERT INTO "procbus_topic_entries" ("topic", "shard", "type", "payload", "bytes", "webhook_id")
SELECT $1, k."shard", $3, $4::jsonb, octet_length($4), $5
FROM "taken" AS k
RETURNING "id", "created_at", NULL::text AS "txn_id";

-- name: take_lease
-- A lease for the caller's connection, in its transaction (it exists if that commits): $3
-- entries and $4 bytes from its own shard ($2) when that is free and has room for four such
-- leases (near its bounds every publish counts exactly), with the IDs of its entries, for $5
-- seconds, armed in the session (the setting $6 holds its ID). No row: no lease (a busy or nearly
-- full shard, a grouped, synchronous or unknown topic).
WITH "taken" AS (
    UPDATE "procbus_topic_shards" AS s
    SET "entries" = s."entries" + $3, "bytes" = s."bytes" + $4
    WHERE s."topic" = $1 AND s."shard" = $2 AND s."queues" AND NOT s."grouped"
      AND s."entries" + 4 * $3 <= s."max_entries" AND s."bytes" + 4 * $4 <= s."max_bytes"
      AND pg_try_advisory_xact_lock("procbus_topic_shard_lock"($1, $2))
    RETURNING s."shard", s."max_payload_bytes"
), "lease" AS (
    INSERT INTO "procbus_topic_leases" ("topic", "shard", "entries", "bytes", "entry_ids",
                                        "expires_at")
    SELECT $1, t."shard", $3, $4,
           ARRAY(SELECT nextval('"procbus_topic_entries_id_seq"') FROM generate_series(1, $3)),
           clock_timestamp() + make_interval(secs => $5)
    FROM "taken" AS t
    RETURNING "id", "entry_ids", "expires_at"
)
SELECT l."id", t."shard", l."entry_ids", l."expires_at", t."max_payload_bytes"
FROM "lease" AS l, "taken" AS t
WHERE set_config($6, l."id"::text, false) IS NOT NULL;  -- armed in the session: see publish_leased

-- name: publish_leased
-- A publish under the connection's lease ($7, of shard $3, expiring at $9, in seconds since the
-- epoch): the entry alone, with an ID of the lease's ($2). No table is read and no lock taken:
-- the session's setting $8 names the lease only if its row committed, and only this session
-- publishes under it, so that an end waits for this transaction (see procbus/topics/functions.sql). Nothing is
-- returned (a RETURNING cost 6% of a single-row business transaction): "INSERT 0 0" means the
-- lease is not armed here (a pool's reset, a rolled-back transaction) or expired; nothing queued.
INSERT INTO "procbus_topic_entries"
    ("topic", "id", "shard", "type", "payload", "bytes", "webhook_id", "lease")
SELECT $1, $2, $3, $4, $5::text::jsonb, octet_length($5::text), $6, $7
WHERE current_setting($8, true) = $7::bigint::text
  AND clock_timestamp() < to_timestamp($9::float8);

-- name: publish_leased_arming
-- The same publish when the lease is not armed in the session: its row, share-locked, must
-- still be there (none when its transaction rolled back, or it ended), taken by this session's
-- server process; then it is armed again.
WITH "lease" AS (
    SELECT l."id" FROM "procbus_topic_leases" AS l
    WHERE l."id" = $7 AND l."topic" = $1 AND l."expires_at" > clock_timestamp()
      AND l."owner_pid" = pg_backend_pid()
    FOR KEY SHARE
)
INSERT INTO "procbus_topic_entries"
    ("topic", "id", "shard", "type", "payload", "bytes", "webhook_id", "lease")
SELECT $1, $2, $3, $4, $5::text::jsonb, octet_length($5::text), $6, l."id"
FROM "lease" AS l
WHERE set_config($8, l."id"::text, false) IS NOT NULL;

-- name: end_lease
-- The owner is done with its lease: what it did not use goes back (in the owner's transaction,
-- never waiting: a busy shard leaves it to expire).
SELECT "procbus_topic_end_leases"($1, $2, false);

-- name: end_expired_leases
SELECT "procbus_topic_end_leases"($1, NULL, true);

-- name: publish_checked
-- The same publish with every check and the other shards: procbus_topic_publish.
SELECT "id", "created_at", CASE WHEN "grouped" THEN $7::text END AS "txn_id"
FROM "procbus_topic_publish"($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: mark_transaction_end
-- Before a publishing transaction commits: on each grouped topic it published to, its last
-- event is marked so, with the transaction's event count (savepoints rolled back left none).
UPDATE "procbus_topic_entries" AS e SET "txn_last" = true, "txn_size" = c."size"
FROM (
    SELECT max(t."id") AS "last", count(*)::integer AS "size"
    FROM "procbus_topic_entries" AS t
    WHERE t."topic" = ANY ($1::text[]) AND t."txn_id" = $2
    GROUP BY t."topic"
) AS c
WHERE e."id" = c."last";

-- name: reserve
SELECT "shard", "expires_at" FROM "procbus_topic_reserve"($1, $2, $3, $4, $5);

-- name: commit_reservation
SELECT "outcome", "topic", "id", "created_at"
FROM "procbus_topic_commit"($1, $2, $3, $4, $5, $6, $7, $8);

-- name: abort_reservation
SELECT "procbus_topic_abort"($1);

-- name: claim_entries
SELECT "id", "key", "type", "payload", "bytes", "webhook_id", "created_at", "attempts",
       "last_error"
FROM "procbus_topic_claim"($1, $2, $3, $4)
ORDER BY "id";

-- name: claim_bodies
-- claim_entries' entries ($1 topic, $2 limit, $4 claim, $5 owner epoch), cut in batches of $3 in queue order,
-- one row per batch: its body (a JSON array of the events), its entries' IDs, their attempts so
-- far and their webhook IDs (from which the batch's ID follows).
SELECT '[' || string_agg("procbus_topic_event_json"(
           to_json($1::text)::text, c."type", c."created_at", c."key", c."payload", NULL, NULL,
           NULL), ',' ORDER BY c."id") || ']' AS "body",
       array_agg(c."id" ORDER BY c."id") AS "entry_ids",
       array_agg(c."attempts" ORDER BY c."id") AS "attempts",
       array_agg(c."webhook_id" ORDER BY c."id") AS "webhook_ids"
FROM (
    SELECT e.*, (row_number() OVER (ORDER BY e."id") - 1) / $3 AS "batch"
    FROM "procbus_topic_claim"($1, $2, $4, $5) AS e
) AS c
GROUP BY c."batch"
ORDER BY c."batch";

-- name: settle_round
-- A delivery round's settlement, in one statement: the topic's claim ends if it is this one
-- ($2) and of the topic's current owner epoch, and only then do the batches it assembled ($4) go, those that failed ($5) kept on their
-- entries first, and the acknowledged entries ($3) go, their capacity given back, counted.
-- "held" is false for an older, overlapping attempt: it settled nothing. The claim's row lock
-- keeps a new claim or a take-over behind this.
WITH "ended" AS (
    DELETE FROM "procbus_topic_claims" AS c
    WHERE c."topic" = $1 AND c."claim" = $2
      AND c."epoch" = (SELECT t."owner_epoch" FROM "procbus_topics" AS t WHERE t."name" = $1)
    RETURNING 1
), "batches" AS MATERIALIZED (
    SELECT "procbus_topic_keep_batches"($1, $5::text[], $4::text[]) FROM "ended"
    WHERE cardinality($4::text[]) > 0
), "gone" AS (
    DELETE FROM "procbus_topic_entries"
    WHERE "topic" = $1 AND "id" = ANY ($3::bigint[]) AND EXISTS (SELECT FROM "ended")
    RETURNING "shard", "bytes", "lease"
), "given_back" AS (
    SELECT "procbus_topic_give_back_entries"(
        $1, array_agg(g."shard"), array_agg(g."bytes"), array_agg(g."lease")) AS "done"
    FROM "gone" AS g
), "counted" AS (
    UPDATE "procbus_topics" SET "delivered" = "delivered" + (SELECT count(*) FROM "gone")
    WHERE "name" = $1 AND EXISTS (SELECT FROM "ended")
)
-- (given_back's one row: reading it gives the capacity back.)
SELECT EXISTS (SELECT FROM "ended") AS "held", (SELECT count(*) FROM "gone") AS "removed",
       (SELECT count(*) FROM "batches") AS "batches"
FROM "given_back";

-- name: record_failures
-- Failed sends: attempts, the next attempt's time and the history, with the entry, so a new
-- owner goes on counting. $4 holds each entry's backoff in seconds.
UPDATE "procbus_topic_entries" AS e
SET "attempts" = e."attempts" + 1,
    "next_attempt_at" = clock_timestamp() + make_interval(secs => f."backoff"),
    "last_error" = f."error",
    "history" = e."history" || jsonb_build_array(
        jsonb_build_object('at', clock_timestamp(), 'error', f."error"))
FROM unnest($2::bigint[], $3::text[], $4::double precision[]) AS f("id", "error", "backoff")
WHERE e."topic" = $1 AND e."id" = f."id"
RETURNING e."id", e."attempts", e."created_at";

-- name: retry_now
-- Entries of a topic that was just stopped: due again as soon as it is enabled.
UPDATE "procbus_topic_entries" SET "next_attempt_at" = clock_timestamp()
WHERE "topic" = $1 AND "id" = ANY ($2::bigint[]);

-- name: count_retried
UPDATE "procbus_topics" SET "retried" = "retried" + $2 WHERE "name" = $1;

-- name: lock_claim_for_take_over
-- A new owner's first act, in one transaction: the claim's row locked first (as a settlement
-- locks it, before the topic's row); the topic's owner epoch bumped (bump_owner_epoch); the claim
-- ended, the new epoch left in its row (take_over_claims), so that an attempt of an older epoch
-- (a dead worker's, or a zombie that this fences out) holds nothing from now on, even one racing
-- this (procbus_topic_hold).
SELECT "claim" FROM "procbus_topic_claims" WHERE "topic" = $1 FOR UPDATE;

-- name: bump_owner_epoch
UPDATE "procbus_topics" SET "owner_epoch" = "owner_epoch" + 1 WHERE "name" = $1
RETURNING "owner_epoch";

-- name: take_over_claims
INSERT INTO "procbus_topic_claims" ("topic", "claim", "epoch") VALUES ($1, NULL, $2)
ON CONFLICT ("topic") DO UPDATE
SET "claim" = NULL, "claimed_at" = clock_timestamp(), "epoch" = excluded."epoch";

-- name: dead_letter_ids
-- Past max_retries or the TTL: out of the queue, into the dead letters, capacity given back.
WITH "dead" AS (
    DELETE FROM "procbus_topic_entries"
    WHERE "topic" = $1 AND "id" = ANY ($2::bigint[])
    RETURNING *
), "kept" AS (
    INSERT INTO "procbus_topic_dead_letters"
        ("id", "topic", "key", "type", "payload", "bytes", "webhook_id", "created_at", "attempts",
         "last_error", "history", "reason", "txn_id", "txn_last", "txn_size", "batch_id")
    SELECT d."id", d."topic", d."key", d."type", d."payload", d."bytes", d."webhook_id",
           d."created_at", d."attempts", d."last_error", d."history", $3, d."txn_id",
           d."txn_last", d."txn_size", d."batch_id"
    FROM "dead" AS d
    RETURNING "id"
), "given_back" AS (
    SELECT "procbus_topic_give_back_entries"(
        $1, array_agg(d."shard"), array_agg(d."bytes"), array_agg(d."lease")) AS "done"
    FROM "dead" AS d
), "counted" AS (
    UPDATE "procbus_topics" SET "dead_lettered" = "dead_lettered" + (SELECT count(*) FROM "kept")
    WHERE "name" = $1
)
-- (given_back's one row: reading it gives the capacity back.)
SELECT (SELECT coalesce(array_agg(k."id" ORDER BY k."id"), '{}') FROM "kept" AS k)
FROM "given_back";

-- name: expired_entries
-- Entries past the topic's TTL, whatever their attempts: for the dead letters. With them go the
-- rest of their transaction and of their batch, so no part of either is delivered alone.
WITH "old" AS (
    SELECT "id", "txn_id", "batch_id" FROM "procbus_topic_entries"
    WHERE "topic" = $1 AND "created_at" < clock_timestamp() - make_interval(secs => $2)
    ORDER BY "id"
    LIMIT $3
)
SELECT "id" FROM "old"
UNION
SELECT e."id" FROM "procbus_topic_entries" AS e  -- by the transaction index
WHERE e."topic" = $1
  AND e."txn_id" = ANY (ARRAY(SELECT o."txn_id" FROM "old" AS o WHERE o."txn_id" IS NOT NULL))
UNION
SELECT e."id" FROM "procbus_topic_entries" AS e  -- by the index of kept batches
WHERE e."topic" = $1 AND e."batch_id" IS NOT NULL
  AND e."batch_id" = ANY (ARRAY(SELECT o."batch_id" FROM "old" AS o WHERE o."batch_id" IS NOT NULL));

-- name: list_dead_letters
SELECT "id", "key", "type", "payload", "bytes", "webhook_id", "created_at", "attempts",
       "last_error", "history", "dead_at", "reason", "txn_id", "txn_last", "txn_size"
FROM "procbus_topic_dead_letters"
WHERE "topic" = $1 AND ($2::bigint[] IS NULL OR "id" = ANY ($2::bigint[]))
ORDER BY "id";

-- name: take_dead_letters
-- Redrive: out of the dead letters, oldest first; published again in the same transaction.
DELETE FROM "procbus_topic_dead_letters"
WHERE "topic" = $1 AND ($2::bigint[] IS NULL OR "id" = ANY ($2::bigint[]))
RETURNING "id", "key", "type", "payload", "webhook_id", "txn_id", "txn_last", "txn_size";

-- name: restore_position
-- A redriven entry of a grouped topic takes its original ID (its place in the queue) again.
UPDATE "procbus_topic_entries" SET "id" = $2 WHERE "id" = $1;

-- name: topic_gauges
-- The depth without reading the queue: the capacity its shards count (committed, reserved and
-- leased) less the reservations, whose rows hold the rest, and less what leases hold unused;
-- the age of its oldest entry. Index probes however deep the queue.
SELECT
    ((SELECT coalesce(sum("entries"), 0) FROM "procbus_topic_shards" WHERE "topic" = $1)
     - (SELECT count(*) FROM "procbus_topic_reservations" WHERE "topic" = $1)
     - (SELECT "procbus_topic_leased"($1)))::bigint AS "depth",
    (SELECT count(*) FROM "procbus_topic_dead_letters" WHERE "topic" = $1) AS "dead_letters",
    -- The oldest committed entry still waiting (leased ones too): a pipeline's lag.
    (SELECT extract(epoch FROM clock_timestamp() - e."created_at")
     FROM "procbus_topic_entries" AS e WHERE e."topic" = $1
     ORDER BY e."id" LIMIT 1)::float8 AS "oldest_seconds";

-- name: topic_stats
SELECT
    (SELECT coalesce(sum("entries"), 0) FROM "procbus_topic_shards" WHERE "topic" = $1)::bigint
        AS "capacity_entries",
    (SELECT coalesce(sum("bytes"), 0) FROM "procbus_topic_shards" WHERE "topic" = $1)::bigint
        AS "capacity_bytes",
    (SELECT count(*) FROM "procbus_topic_reservations"
     WHERE "topic" = $1 AND "expires_at" >= clock_timestamp()) AS "reserved",
    "procbus_topic_leased"($1) AS "leased",
    (SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1) AS "depth",
    (SELECT coalesce(sum("bytes"), 0) FROM "procbus_topic_entries" WHERE "topic" = $1)::bigint
        AS "depth_bytes",
    (SELECT min("created_at") FROM "procbus_topic_entries" WHERE "topic" = $1) AS "oldest",
    (SELECT count(*) FROM "procbus_topic_entries" WHERE "topic" = $1 AND "attempts" > 0)
        AS "retrying",
    (SELECT count(DISTINCT "key") FROM "procbus_topic_entries"
     WHERE "topic" = $1 AND "key" IS NOT NULL AND "next_attempt_at" > clock_timestamp())
        AS "blocked_keys",
    (SELECT count(*) FROM "procbus_topic_dead_letters" WHERE "topic" = $1) AS "dead_letters",
    -- Why the oldest waiting entry that failed did: what holds the queue up now.
    (SELECT "last_error" FROM "procbus_topic_entries"
     WHERE "topic" = $1 AND "attempts" > 0 AND "last_error" IS NOT NULL
     ORDER BY "id" LIMIT 1) AS "last_error",
    clock_timestamp() AS "now";

-- name: count_sync_send
-- A synchronous send: acknowledged ($2) or not.
UPDATE "procbus_topics"
SET "delivered" = "delivered" + CASE WHEN $2 THEN 1 ELSE 0 END,
    "nacked" = "nacked" + CASE WHEN $2 THEN 0 ELSE 1 END
WHERE "name" = $1;

-- ---- grouped topics (procbus.batching): a batch is assembled once, then kept ----

-- name: claim_kept_batch
-- The oldest batch that was sent and failed, once it is due again: claimed whole, in its order
-- (the claim becomes the topic's one claim when there is such a batch, for owner epoch $3).
WITH "batch" AS MATERIALIZED (
    SELECT "batch_id" FROM "procbus_topic_entries"
    WHERE "topic" = $1 AND "batch_id" IS NOT NULL AND "next_attempt_at" <= clock_timestamp()
    ORDER BY "id"
    LIMIT 1
), "held" AS MATERIALIZED (
    SELECT "procbus_topic_hold"($1, $2, $3) FROM "batch"
)
SELECT e."id", e."key", e."type", e."payload", e."bytes", e."webhook_id", e."created_at",
          e."attempts", e."last_error", e."txn_id", e."txn_last", e."txn_size", e."batch_id",
          e."batch_seq"
FROM "batch" AS b, "procbus_topic_entries" AS e
WHERE e."topic" = $1 AND e."batch_id" = b."batch_id" AND EXISTS (SELECT FROM "held");

-- name: kept_batch_body
-- A kept batch's body: the same bytes as when it was first sent (grouped_view_for_bodies).
SELECT '[' || string_agg("procbus_topic_event_json"(
           to_json($1::text)::text, e."type", e."created_at", e."key", e."payload", e."txn_id",
           e."txn_last", e."txn_size"), ',' ORDER BY e."batch_seq") || ']'
FROM "procbus_topic_entries" AS e
WHERE e."topic" = $1 AND e."batch_id" = $2;

-- name: grouped_view
SELECT "id", "key", "txn_id", "txn_last", "txn_size", "created_at", "blocked", "in_window",
       "any_kept", "now", "type", "payload", "bytes", "webhook_id", "attempts", "last_error"
FROM "procbus_topic_view"($1, $2, $3, $4);

-- name: grouped_view_for_bodies
-- The same look for an endpoint that takes only bodies: each event's JSON as claim_bodies puts it
-- in a body (with the transaction fields), which the worker joins into its batch's body, and
-- its attempts so far; not the contents.
SELECT "id", "key", "txn_id", "txn_last", "txn_size", "created_at", "blocked", "in_window",
       "any_kept", "now", "attempts",
       "procbus_topic_event_json"(to_json($1::text)::text, "type", "created_at", "key",
           "payload", "txn_id", "txn_last", "txn_size") AS "body"
FROM "procbus_topic_view"($1, $2, $3, $4);

-- name: assign_batches
-- Keep assembled batches, one row each: IDs $2 of $3 entries each, their entries one batch
-- after the other in $5 (each in send order); count the batches that go without a transaction's
-- missing events ($6). The entries were read by procbus_topic_view for the claim $4, and are
-- kept only while it is still the topic's claim: every change to an entry's batch is made under
-- the topic's claim, so nothing read has changed since. Its row lock holds off a new claim until
-- this commits. False: another attempt claimed the topic since, and nothing was kept.
WITH "held" AS (
    SELECT 1 FROM "procbus_topic_claims" WHERE "topic" = $1 AND "claim" = $4 FOR UPDATE
), "kept" AS (
    INSERT INTO "procbus_topic_batches" ("topic", "batch_id", "entry_ids")
    SELECT $1, b."batch_id", ($5::bigint[])[b."ends" - b."size" + 1 : b."ends"]
    FROM (
        SELECT u."batch_id", u."size", sum(u."size") OVER (ORDER BY u."n") AS "ends"
        FROM unnest($2::text[], $3::integer[]) WITH ORDINALITY AS u("batch_id", "size", "n")
    ) AS b
    WHERE EXISTS (SELECT FROM "held")
), "counted" AS (
    UPDATE "procbus_topics" SET "incomplete_batches" = "incomplete_batches" + $6
    WHERE "name" = $1 AND $6 > 0 AND EXISTS (SELECT FROM "held")
)
SELECT EXISTS (SELECT FROM "held");

-- name: hold_claim
-- A new claim on the topic (for owner epoch $3), for a change that any attempt in flight must
-- not settle over.
SELECT "procbus_topic_hold"($1, $2, $3);

-- name: database_time
SELECT clock_timestamp();

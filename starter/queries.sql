-- The demo's own statements (`procbus demo`, starter/scenes/).

-- name: outbox_rows_of
-- The hooks scene: a rolled-back transaction leaves no outbox row for its workflow.
SELECT count(*) FROM "procbus_outbox" WHERE "workflow_id" = $1;

-- name: create_accounts
-- The pipeline scene's application: a bank whose accounts table procbus captures.
DROP TABLE IF EXISTS "procbus_demo_accounts";
CREATE TABLE "procbus_demo_accounts" (
    "id" bigint PRIMARY KEY,
    "owner" text NOT NULL,
    "balance" bigint NOT NULL
);

-- name: open_accounts
INSERT INTO "procbus_demo_accounts"
SELECT g, 'owner-' || g, $1 FROM generate_series(1, $2) AS g;

-- name: lock_accounts
-- Both accounts of a transfer, in ID order, as a bank would: transfers never deadlock.
SELECT FROM "procbus_demo_accounts" WHERE "id" = ANY ($1::bigint[]) ORDER BY "id" FOR UPDATE;

-- name: move_money
UPDATE "procbus_demo_accounts" SET "balance" = "balance" + $2 WHERE "id" = $1;

-- name: accounts
SELECT "id", "owner", "balance" FROM "procbus_demo_accounts" ORDER BY "id";

-- name: drop_accounts
DROP TABLE IF EXISTS "procbus_demo_accounts";

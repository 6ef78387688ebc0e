-- name: claim_token_use
-- The run that first presents a token keeps it; the same run asking again (a retried local
-- activity) gets its own run ID back, any other run the first one's.
INSERT INTO "procbus_principal_token_uses" ("token_mac", "workflow_id", "run_id", "expires_at")
VALUES ($1, $2, $3, $4)
ON CONFLICT ("token_mac") DO UPDATE SET "token_mac" = EXCLUDED."token_mac"
RETURNING "run_id";

-- name: forget_token_uses
-- Long past expiry no run can start with the token any more (its start time would be late).
DELETE FROM "procbus_principal_token_uses" WHERE "expires_at" < now() - make_interval(secs => $1);

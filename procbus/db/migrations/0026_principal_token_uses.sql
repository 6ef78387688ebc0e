-- Each principal token starts one run: the first run that presents it claims it here, and a
-- start that copies it from a history (any `temporal` CLI user may read one) is refused, also
-- under the same workflow ID once the first run has closed.
CREATE TABLE "procbus_principal_token_uses" (
    "token_mac" text PRIMARY KEY,
    "workflow_id" text NOT NULL,
    "run_id" text NOT NULL,
    "expires_at" timestamptz NOT NULL,
    "used_at" timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX "procbus_principal_token_uses_expiry" ON "procbus_principal_token_uses" ("expires_at");

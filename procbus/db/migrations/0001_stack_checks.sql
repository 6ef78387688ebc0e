-- The round trips of the StackCheck workflow: proof that a worker reached the database.
CREATE TABLE "procbus_stack_checks" (
    "id" bigserial PRIMARY KEY,
    "check_id" text NOT NULL UNIQUE,
    "message" text NOT NULL,
    "worker" text NOT NULL,
    "written_at" timestamptz NOT NULL DEFAULT now()
);

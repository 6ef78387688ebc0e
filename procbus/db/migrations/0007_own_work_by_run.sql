-- What a procedure makes is its own by its workflow ID and its first run ID: a start may reuse a
-- closed run's workflow ID (and read it from `table describe` or the UI), never its run ID.
-- Rows made before this carry '' (their maker's runs keyed by the workflow ID alone, as then):
-- no run of a procedure begun since matches them, and none needs a manual step.
ALTER TABLE "procbus_namespaces" ADD COLUMN "created_run" text NOT NULL DEFAULT '';
ALTER TABLE "procbus_tables" ADD COLUMN "created_run" text NOT NULL DEFAULT '';
ALTER TABLE "procbus_events" ADD COLUMN "procedure_run" text NOT NULL DEFAULT '';
ALTER TABLE "procbus_events" DROP CONSTRAINT "procbus_events_procedure_id_event_type_key";
ALTER TABLE "procbus_events" ADD CONSTRAINT "procbus_events_procedure_id_procedure_run_event_type_key"
    UNIQUE ("procedure_id", "procedure_run", "event_type");

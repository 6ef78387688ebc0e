-- A bus member's row carries the incarnation of the process that holds it: a process joining
-- under the ID takes a new one, and the process before (stopped, paused, or a duplicate started
-- by mistake) finds it changed at its next heartbeat and stops serving. Drawn from a sequence, so
-- an incarnation is never handed out twice, also after a forgotten row is made again.
CREATE SEQUENCE "procbus_bus_incarnations";

ALTER TABLE "procbus_bus_members"
    ADD COLUMN "incarnation" bigint NOT NULL DEFAULT nextval('"procbus_bus_incarnations"');

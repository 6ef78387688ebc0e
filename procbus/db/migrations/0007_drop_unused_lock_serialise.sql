-- Since 0006 acquire and release take the resources' advisory locks themselves; nothing calls
-- procbus_lock_serialise any more.
DROP FUNCTION "procbus_lock_serialise"(text[]);

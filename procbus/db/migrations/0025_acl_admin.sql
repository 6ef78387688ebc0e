-- A table permission `admin`: who holds it may grant and revoke permissions on the table (its
-- creator gets it with the table). Before, anyone who could start ChangeAccess could.

ALTER TABLE "procbus_acl"
    DROP CONSTRAINT "procbus_acl_permission_check",
    ADD CONSTRAINT "procbus_acl_permission_check"
        CHECK ("permission" IN ('read', 'write', 'admin'));

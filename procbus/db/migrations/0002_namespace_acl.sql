-- Grants on a namespace: a permission on every table in it, now and later (shown and granted
-- as 'NAMESPACE.*'); `admin` on a namespace may grant and revoke on it and on its tables. A
-- deleted namespace takes its grants with it. Its creator gets admin with the namespace; one
-- made before this migration has no admin until the operator grants one.

CREATE TABLE "procbus_namespace_acl" (
    "principal" text NOT NULL,
    "namespace" text NOT NULL REFERENCES "procbus_namespaces" ("name") ON DELETE CASCADE,
    "permission" text NOT NULL CHECK ("permission" IN ('read', 'write', 'admin')),
    "granted_by" text NOT NULL,
    "granted_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("principal", "namespace", "permission")
);

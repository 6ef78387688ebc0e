"""The notification bus: operations that must reach every worker (HBase notification bus).

Each worker process is a member with its own task queue, registered in PostgreSQL with a
heartbeat (`membership`). A coordinator, the state of a Temporal workflow, sends an operation
to every live member and waits for all: one phase (apply) or two (prepare, then commit or
abort). Members keep no durable state: they rebuild their caches from the catalog at start.
"""

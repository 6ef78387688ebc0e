"""procbus: safe multi-step, multi-system operations for data platforms, on Temporal.

One package per mechanism: procedures, locks, hooks (and the outbox), lakehouse, temporal, db,
stack, spark. Nothing is imported here, so each command pays only for what it uses.
"""

"""procbus: safe multi-step, multi-system operations for data platforms, on Temporal.

One package per mechanism, in layers (docs/internals/layout.md; import-linter keeps them): core
and errors at the bottom; the mechanisms (db, batching, locks, topics, procedures, lakehouse,
auth, bus, spark) above them; the integrations (capture, delivery, pipeline, retention, hooks)
above those; the settings (config), the Temporal adapter (temporal) and the embedded stack
(stack) on top. Nothing is imported here, so each command pays only for what it uses.
"""

"""procbus's own spans in workflow code: a step, an undo, a lock wait, a broadcast phase.

A span is recorded only where Temporal's tracing interceptor runs the workflow (ProcbusPlugin
adds it with PROCBUS_OTEL or a configured tracer provider), as a completed span under the
workflow's own, and never while a history replays (the interceptor's rule): nothing here
changes what the workflow does, so its determinism is untouched.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.core import workflow_span_recorder


def record_span(name: str, error: BaseException | None = None, **attributes: str | int) -> None:
    """A completed span `name` with the procedure's ID and `attributes`, when traced."""
    record = workflow_span_recorder()
    if record is None:
        return
    info = workflow.info()
    record(
        name,
        {
            "procbus.procedure_id": info.workflow_id,
            "procbus.procedure_type": info.workflow_type,
            **attributes,
        },
        error if isinstance(error, Exception) else None,
    )

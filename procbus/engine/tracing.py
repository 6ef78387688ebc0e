"""procbus's own spans in workflow code: a step, an undo, a lock wait, a broadcast phase.

A span is recorded only where Temporal's tracing interceptor runs the workflow (ProcbusPlugin
adds it with PROCBUS_OTEL or a configured tracer provider), as a completed span under the
workflow's own, and never while a history replays (the interceptor's rule): nothing here
changes what the workflow does, so its determinism is untouched.
"""

from __future__ import annotations

import sys

from temporalio import workflow

_CONTRIB = "temporalio.contrib.opentelemetry"


def record_span(name: str, error: BaseException | None = None, **attributes: str | int) -> None:
    """A completed span `name` with the procedure's ID and `attributes`, when traced."""
    # Loaded by whoever installed the interceptor; not loaded: no interceptor, nothing to do.
    contrib = sys.modules.get(_CONTRIB)
    if contrib is None:
        return
    interceptor = contrib.TracingWorkflowInboundInterceptor._from_context()
    if interceptor is None:
        return
    info = workflow.info()
    interceptor._completed_span(
        name,
        additional_attributes={
            "procbus.procedure_id": info.workflow_id,
            "procbus.procedure_type": info.workflow_type,
            **attributes,
        },
        exception=error if isinstance(error, Exception) else None,
    )

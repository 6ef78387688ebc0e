"""Every use procbus makes of temporalio's private names, in one place: a temporalio upgrade that
changes them breaks here, and tests/unit/test_temporalio_private.py says what changed.

In procbus.core, not procbus.temporal: procbus.hooks, a layer below the Temporal adapter, needs it.
Pure: reads what temporalio's decorators and tracing interceptor recorded, safe in workflow code.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from temporalio import activity, workflow

if TYPE_CHECKING:
    from temporalio.worker import Worker

# Temporal's tracing interceptor; loaded by whoever installs it (ProcbusPlugin), else no spans.
TRACING_MODULE = "temporalio.contrib.opentelemetry"

# Records a completed span: its name, its attributes, the exception it ended with.
SpanRecorder = Callable[[str, Mapping[str, str | int], Exception | None], None]


@dataclass(frozen=True)
class WorkflowDefinition:
    """What `@workflow.defn` recorded of a workflow: its type name and its run method."""

    name: str | None  # None: a dynamic workflow
    run_fn: Callable[..., Awaitable[Any]]


def defined_activity_name(fn: Callable[..., Any]) -> str | None:
    """Return the name `@activity.defn` gave `fn`; None for a dynamic activity.

    Raises:
        TypeError: `fn` is not an activity (no `@activity.defn`).
    """
    return activity._Definition.must_from_callable(fn).name


def is_activity(fn: Callable[..., Any]) -> bool:
    """Return whether `@activity.defn` made `fn` an activity."""
    return activity._Definition.from_callable(fn) is not None


def workflow_definition(
    defined: type | Callable[..., Awaitable[Any]],
) -> WorkflowDefinition | None:
    """Return the `@workflow.defn` of a class (its own, not a base class's) or of a class's
    `@workflow.run` method; None for anything else."""
    if isinstance(defined, type):
        found = workflow._Definition.from_class(defined)
    else:
        found = workflow._Definition.from_run_fn(defined)
    if found is None:
        return None
    return WorkflowDefinition(name=found.name, run_fn=found.run_fn)


def workflow_span_recorder() -> SpanRecorder | None:
    """Return how to record a completed span under the running workflow's own, or None where
    Temporal's tracing interceptor does not run this workflow. It records nothing on replay."""
    tracing = sys.modules.get(TRACING_MODULE)
    if tracing is None:
        return None
    interceptor = tracing.TracingWorkflowInboundInterceptor._from_context()
    if interceptor is None:
        return None

    def record(name: str, attributes: Mapping[str, str | int], exception: Exception | None) -> None:
        interceptor._completed_span(name, additional_attributes=attributes, exception=exception)

    return record


def mark_never_started(worker: Worker) -> None:
    """Mark `worker` shut down, for a plugin that refuses to run it: `async with Worker` waits
    for a shutdown that only a started worker completes, and would wait forever."""
    worker._shutdown_complete_event.set()

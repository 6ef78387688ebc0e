"""Starting and steering procedures from outside: start, status, list, wait, abort, retry, skip.

What the CLI uses, and what a starter script can use instead of raw Temporal calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import MetricGauge, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from procbus.errors import ProcbusError
from procbus.procedures.models import (
    AbortRequest,
    ProcedureInput,
    ProcedureState,
    ProcedureStatus,
    SkipRequest,
)

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
# A status query that waits longer than this is given up and asked again.
QUERY_TIMEOUT_SECONDS = 10.0
# Answers that mean "no worker answered in time" (one paused, or gone with the sticky task).
_UNANSWERED = frozenset(
    {RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE}
)


class StatusUnreadable(ProcbusError):
    """No worker answered the status query in time; the procedure may well be running."""

    def __init__(self, procedure_id: str, reason: str) -> None:
        super().__init__(f"cannot read procedure {procedure_id!r}: {reason}")
        self.reason = reason


class ProcedureSummary(BaseModel):
    """One procedure as `list_procedures` shows it."""

    procedure_id: str
    procedure_type: str
    target: str
    state: str
    temporal_status: str
    started_at: datetime | None
    closed_at: datetime | None


def new_procedure_id(procedure_type: str, target: str) -> str:
    """Return a new procedure ID: its type, its target and a random suffix.

    Args:
        procedure_type: the procedure's workflow type.
        target: what it acts on (a table's name, say).
    """
    return f"{procedure_type}-{target}-{uuid.uuid4().hex[:8]}"


async def start_procedure(
    client: Client,
    procedure_type: str,
    request: ProcedureInput,
    *,
    task_queue: str,
    procedure_id: str,
    summary: str | None = None,
) -> WorkflowHandle[object, object]:
    """Start it; the same ID again returns the procedure started under it, running or ended:
    a start asked again after its answer was lost never runs the procedure twice."""
    try:
        return await client.start_workflow(
            procedure_type,
            request,
            id=procedure_id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=summary,
        )
    except WorkflowAlreadyStartedError:  # it ended: the same procedure, its last run
        described = await client.get_workflow_handle(procedure_id).describe()
        return client.get_workflow_handle(procedure_id, run_id=described.run_id)


async def procedure_status(
    client: Client, procedure_id: str, *, query_timeout: float | None = None
) -> ProcedureStatus:
    """Return a procedure's status, asked of the worker that runs it.

    Args:
        client: a connected Temporal client.
        procedure_id: the procedure's workflow ID.
        query_timeout: seconds to wait for an answer (None: the server's own limit).

    Raises:
        StatusUnreadable: when no worker answers in time.
        ProcbusError: when there is no such procedure, or the server refuses the query.
    """
    handle = client.get_workflow_handle(procedure_id)
    rpc_timeout = None if query_timeout is None else timedelta(seconds=query_timeout)
    try:
        status: ProcedureStatus = await handle.query(
            "status", result_type=ProcedureStatus, rpc_timeout=rpc_timeout
        )
        return status
    except WorkflowQueryFailedError as error:
        # No status to ask: the run failed before its code ran (its input was refused).
        return await _status_of_unstarted(handle, error)
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise ProcbusError(f"no procedure with ID {procedure_id!r}") from None
        if error.status in _UNANSWERED:
            raise StatusUnreadable(procedure_id, error.message) from None
        raise ProcbusError(f"cannot read procedure {procedure_id!r}: {error.message}") from None


async def _status_of_unstarted(
    handle: WorkflowHandle[object, object], query_error: WorkflowQueryFailedError
) -> ProcedureStatus:
    description = await handle.describe()
    if description.status is not WorkflowExecutionStatus.FAILED:
        raise ProcbusError(f"cannot read procedure {handle.id!r}: {query_error}") from None
    try:
        await handle.result()
    except WorkflowFailureError as failed:
        cause = failed.cause
        error = (
            f"{cause.type}: {cause.message}" if isinstance(cause, ApplicationError) else str(cause)
        )
    else:  # pragma: no cover - a FAILED run always raises
        error = str(query_error)
    return ProcedureStatus(
        procedure_id=handle.id,
        procedure_type=description.workflow_type,
        target="",
        state=ProcedureState.FAILED,
        error=error,
    )


async def list_procedures(
    client: Client, *, state: str | None = None, procedure_type: str | None = None, limit: int = 200
) -> list[ProcedureSummary]:
    """Return procedures, newest first, found by their search attributes.

    Args:
        client: a connected Temporal client.
        state: only procedures in this ProcedureState (any case).
        procedure_type: only procedures of this type, e.g. "CreateTable".
        limit: at most this many.

    Raises:
        ProcbusError: for an unknown state or a procedure type that is no identifier.
    """
    conditions = ["ProcedureType IS NOT NULL"]
    if state:
        if state.upper() not in ProcedureState.__members__:
            known = ", ".join(ProcedureState.__members__)
            raise ProcbusError(f"unknown state {state!r}; known: {known}")
        conditions.append(f"ProcedureState = '{state.upper()}'")
    if procedure_type:
        if not procedure_type.isidentifier():
            raise ProcbusError(f"unknown procedure type {procedure_type!r}")
        conditions.append(f"ProcedureType = '{procedure_type}'")
    summaries = []
    async for execution in client.list_workflows(" AND ".join(conditions), limit=limit):
        attributes = execution.typed_search_attributes
        values = {pair.key.name: pair.value for pair in attributes}
        summaries.append(
            ProcedureSummary(
                procedure_id=execution.id,
                procedure_type=str(values.get("ProcedureType", execution.workflow_type)),
                target=str(values.get("ProcedureTarget", "")),
                state=str(values.get("ProcedureState", "")),
                temporal_status=execution.status.name if execution.status else "UNKNOWN",
                started_at=execution.start_time,
                closed_at=execution.close_time,
            )
        )
    return summaries


async def count_stuck(client: Client) -> int:
    """Return how many procedures of the client's namespace are STUCK now (still running,
    waiting for an operator to retry or skip their failing undo)."""
    found = await client.count_workflows("ProcedureState = 'STUCK' AND ExecutionStatus = 'Running'")
    return found.count


async def report_stuck(
    client: Client, gauge: MetricGauge, stop: asyncio.Event, every_seconds: float = 30.0
) -> None:
    """Set `gauge` to count_stuck every `every_seconds` until `stop` is set; a count that
    fails (Temporal unreachable for a while) leaves the last value and is tried again."""
    while not stop.is_set():
        try:
            gauge.set(await count_stuck(client))
        except RPCError as error:
            log.warning("cannot count STUCK procedures: %s", error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_seconds)


async def wait_for_procedure(
    client: Client,
    procedure_id: str,
    *,
    timeout_seconds: float | None = None,
    on_change: Callable[[ProcedureStatus], None] | None = None,
    on_unreadable: Callable[[str], None] | None = None,
) -> ProcedureStatus:
    """Poll until it ends (or is STUCK, which needs a person); calls on_change as it moves.

    A status query no worker answers (its worker paused, say) is asked again until the
    timeout; on_unreadable hears of it once per stretch without an answer."""
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    last: ProcedureStatus | None = None
    unreadable_since: float | None = None
    handle = client.get_workflow_handle(procedure_id)
    while True:
        query_timeout = QUERY_TIMEOUT_SECONDS
        if deadline is not None:  # the last query ends near the wait's own timeout
            query_timeout = max(1.0, min(query_timeout, deadline - time.monotonic()))
        asked_at = time.monotonic()
        try:
            status = await procedure_status(client, procedure_id, query_timeout=query_timeout)
        except StatusUnreadable as error:
            if unreadable_since is None:
                unreadable_since = asked_at
                if on_unreadable is not None:
                    on_unreadable(
                        f"procedure {procedure_id}: its status cannot be read right now (no "
                        f"worker answered: {error.reason}); still waiting"
                    )
            if deadline is not None and time.monotonic() > deadline:
                seen = f", last seen {last.state.value}" if last is not None else ""
                raise ProcbusError(
                    f"procedure {procedure_id}: its status could not be read for the last "
                    f"{time.monotonic() - unreadable_since:.0f}s{seen} (its worker does not "
                    f"answer); gave up after {timeout_seconds:g}s"
                ) from None
            await asyncio.sleep(POLL_SECONDS)
            continue
        unreadable_since = None
        if on_change is not None and status != last:
            on_change(status)
        last = status
        if status.state.finished or status.state is ProcedureState.STUCK:
            # The state is final before the workflow closes; let the run close too.
            if status.state.finished:
                await _closed(handle)
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise ProcbusError(
                f"procedure {procedure_id} is still {status.state.value} after {timeout_seconds:g}s"
            )
        await asyncio.sleep(POLL_SECONDS)


async def pending_details(client: Client, procedure_id: str) -> dict[str, object]:
    """The last heartbeat details of each running step (activity ID -> details): what the
    Temporal UI shows for a pending activity, e.g. a Spark job's progress."""
    description = await client.get_workflow_handle(procedure_id).describe()
    details: dict[str, object] = {}
    for pending in description.raw_description.pending_activities:
        if pending.heartbeat_details.payloads:
            decoded = client.data_converter.payload_converter.from_payloads(
                list(pending.heartbeat_details.payloads)
            )
            details[pending.activity_id] = decoded[-1]
    return details


async def _closed(handle: WorkflowHandle[object, object]) -> None:
    for _ in range(40):
        description = await handle.describe()
        if description.status not in (None, WorkflowExecutionStatus.RUNNING):
            return
        await asyncio.sleep(POLL_SECONDS)


async def _update(client: Client, procedure_id: str, update: str, *args: object) -> ProcedureStatus:
    handle = client.get_workflow_handle(procedure_id)
    try:
        status: ProcedureStatus = await handle.execute_update(
            update, *args, result_type=ProcedureStatus
        )
        return status
    except WorkflowUpdateFailedError as error:
        raise ProcbusError(f"{update} refused: {error.cause}") from None
    except RPCError as error:
        if "already completed" in error.message:
            status = await procedure_status(client, procedure_id)
            raise ProcbusError(
                f"{update} refused: procedure {procedure_id} already ended {status.state.value}"
            ) from None
        if error.status is RPCStatusCode.NOT_FOUND:
            raise ProcbusError(f"no procedure with ID {procedure_id!r}") from None
        raise ProcbusError(f"{update} failed: {error.message}") from None


async def abort_procedure(client: Client, procedure_id: str, reason: str) -> ProcedureStatus:
    """Abort a running procedure: it rolls back what it did, or rolls forward past its pivot.

    Args:
        client: a connected Temporal client.
        procedure_id: the procedure's workflow ID.
        reason: why, recorded in its status.

    Raises:
        ProcbusError: when the procedure refuses the abort or cannot be reached.
    """
    return await _update(client, procedure_id, "abort", AbortRequest(reason=reason))


async def retry_procedure(client: Client, procedure_id: str) -> ProcedureStatus:
    """Retry a procedure's failed compensation now, without waiting for its next attempt.

    Args:
        client: a connected Temporal client.
        procedure_id: the procedure's workflow ID.

    Raises:
        ProcbusError: when the procedure refuses the retry or cannot be reached.
    """
    return await _update(client, procedure_id, "retry")


async def skip_compensation(client: Client, procedure_id: str, reason: str) -> ProcedureStatus:
    """Skip a procedure's failing compensation, recording why, so its rollback goes on.

    Args:
        client: a connected Temporal client.
        procedure_id: the procedure's workflow ID.
        reason: why the undo may be skipped, recorded in its status.

    Raises:
        ProcbusError: when `reason` is empty, or the procedure refuses the skip.
    """
    if not reason.strip():
        raise ProcbusError("skip needs a reason: it is recorded in the procedure's status")
    return await _update(client, procedure_id, "skip", SkipRequest(reason=reason))

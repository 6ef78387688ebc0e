"""The durable outbox relay: performs committed Temporal calls exactly once at the Temporal level.

Rows are claimed with a lease, the connection is released, Temporal is called, then the row is
marked done. A relay that dies mid-call leaves its rows to the next one after the lease. A
repeated start finds the run already there (the workflow ID is fixed by the row and a duplicate
is rejected); a repeated signal carries the row's request ID, which the server deduplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
from pydantic import BaseModel
from temporalio.api.common.v1 import Payloads, WorkflowExecution
from temporalio.api.workflowservice.v1 import SignalWorkflowExecutionRequest
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from procbus.core import (
    BROADCAST,
    OUTBOX_SWEEP,
    RETENTION,
    TOPIC_DELIVERY,
    OutboxMetrics,
    WorkflowInput,
)
from procbus.db import load_queries
from procbus.errors import InvalidRequest
from procbus.procedures.models import ENGINE_ONLY_FIELDS

log = logging.getLogger(__name__)

QUERIES = "procbus.hooks"
CLAIM_SECONDS = 30.0
RETRY_AFTER_SECONDS = 2.0
BATCH = 100
# How often the relay loop reports the backlog (a count over the pending rows' index).
BACKLOG_EVERY_SECONDS = 5.0
SWEEP_SCHEDULE_ID = "procbus-outbox-sweep"
# Every worker's relay loop sweeps all the time; the Schedule is the safety net behind them, and
# rare, so the Temporal UI's workflow list shows procedures, not a sweep a minute.
SWEEP_EVERY = timedelta(hours=1)


# procbus's own machinery, started only by procbus itself: a row may never name them.
INTERNAL_WORKFLOW_TYPES = frozenset({BROADCAST, OUTBOX_SWEEP, RETENTION, TOPIC_DELIVERY})
# The engine's signals (a child's undo stack, lock wake-ups) carry engine state.
ENGINE_SIGNAL_PREFIX = "procbus_"


def outbox_refusal(
    kind: str,
    workflow_type: str | None,
    signal_name: str | None,
    args: Any,
    allowed_workflow_types: frozenset[str] | None = None,
) -> str | None:
    """Why an outbox call may not be performed, or None when it may. Checked when the
    application queues it and again by the relay, since anyone who can write a row to
    procbus_outbox could otherwise start or signal anything as a worker."""
    if kind == "start_workflow":
        if workflow_type in INTERNAL_WORKFLOW_TYPES:
            return f"{workflow_type} is procbus's own workflow: only procbus starts it"
        if allowed_workflow_types is not None and workflow_type not in allowed_workflow_types:
            return (
                f"workflow type {workflow_type!r} is not in PROCBUS_OUTBOX_WORKFLOW_TYPES "
                f"({', '.join(sorted(allowed_workflow_types)) or 'empty'})"
            )
    elif (signal_name or "").startswith(ENGINE_SIGNAL_PREFIX):
        return f"signal {signal_name!r} is the engine's own: only procbus sends it"
    for arg in args if isinstance(args, list) else [args]:
        if isinstance(arg, dict):
            engine_state = [field for field in ENGINE_ONLY_FIELDS if arg.get(field)]
            if engine_state:
                return (
                    f"{', '.join(engine_state)}: engine state, set only by procbus for its own "
                    "runs; a start may not set it"
                )
    return None


class OutboxRowRefused(InvalidRequest):
    """A row names what an outbox call may not do; it is closed with the reason, not retried."""


class SweepRequest(WorkflowInput):
    """Input of the OutboxSweep workflow: perform up to this many rows left behind."""

    limit: int = 1000


class SweepResult(BaseModel):
    performed: int
    pending: int


@dataclass(frozen=True)
class OutboxRow:
    id: int
    kind: str
    workflow_id: str
    workflow_type: str | None
    signal_name: str | None
    task_queue: str | None
    payload: Any
    request_id: str


class OutboxRelay:
    """Performs outbox rows: the ones a transaction just committed, and any left behind."""

    def __init__(
        self,
        client: Client,
        pool: asyncpg.Pool,
        default_task_queue: str,
        metrics: OutboxMetrics | None = None,
        allowed_workflow_types: frozenset[str] | None = None,
    ) -> None:
        self.client = client
        self.pool = pool
        self.default_task_queue = default_task_queue
        self.metrics = metrics
        self.allowed_workflow_types = allowed_workflow_types
        self.queries = load_queries(QUERIES)

    async def claim(self, limit: int = BATCH, ids: list[int] | None = None) -> list[OutboxRow]:
        rows = await self.pool.fetch(self.queries["claim_outbox_rows"], limit, CLAIM_SECONDS, ids)
        return [
            OutboxRow(
                id=row["id"],
                kind=row["kind"],
                workflow_id=row["workflow_id"],
                workflow_type=row["workflow_type"],
                signal_name=row["signal_name"],
                task_queue=row["task_queue"],
                payload=row["payload"],
                request_id=str(row["request_id"]),
            )
            for row in rows
        ]

    async def perform_ids(self, ids: list[int]) -> dict[int, str | None]:
        """Perform these rows now (those no other relay holds); run IDs by row ID."""
        return {row.id: await self.perform(row) for row in await self.claim(len(ids), ids)}

    async def sweep(self, limit: int = BATCH) -> int:
        """Perform pending rows, oldest first; how many were done."""
        rows = await self.claim(limit)
        outcomes = await asyncio.gather(*(self._call_logged(row) for row in rows))
        done = [(row.id, run_id) for row, (ok, run_id) in zip(rows, outcomes, strict=True) if ok]
        if self.metrics is not None:
            for row, (ok, _) in zip(rows, outcomes, strict=True):
                if ok:
                    self.metrics.performed.add(1, {"kind": row.kind})
                else:
                    self.metrics.failures.add(1)
        if done:
            # One statement for the whole sweep; a relay that dies before it only repeats calls
            # Temporal deduplicates (the row's workflow ID, the signal's request ID).
            await self.pool.execute(
                self.queries["mark_outbox_rows_done"],
                [row_id for row_id, _ in done],
                [run_id for _, run_id in done],
            )
        return len(done)

    async def _call_logged(self, row: OutboxRow) -> tuple[bool, str | None]:
        try:
            run_id = await self._call_temporal(row)
        except OutboxRowRefused as refused:  # closed with its reason; never tried again
            log.warning("outbox row %s refused: %s", row.id, refused)
            return False, None
        except Exception as error:  # stays pending; the next sweep tries again
            log.warning(
                "outbox row %s (%s %s) failed: %s", row.id, row.kind, row.workflow_id, error
            )
            with contextlib.suppress(Exception):  # if not recorded, the claim runs out instead
                await self._mark_failed(row, error)
            return False, None
        return True, run_id

    async def perform(self, row: OutboxRow) -> str | None:
        """The Temporal call of one claimed row; no database connection is held meanwhile."""
        try:
            run_id = await self._call_temporal(row)
        except OutboxRowRefused:
            raise
        except Exception as error:
            await self._mark_failed(row, error)
            raise
        await self.pool.execute(self.queries["mark_outbox_done"], row.id, run_id)
        return run_id

    async def _mark_failed(self, row: OutboxRow, error: Exception) -> None:
        await self.pool.execute(
            self.queries["mark_outbox_failed"], row.id, str(error), RETRY_AFTER_SECONDS
        )

    async def _refuse_unless_allowed(self, row: OutboxRow) -> None:
        refusal = outbox_refusal(
            row.kind, row.workflow_type, row.signal_name, row.payload, self.allowed_workflow_types
        )
        if refusal is not None:
            await self.pool.execute(self.queries["close_refused_outbox_row"], row.id, refusal)
            raise OutboxRowRefused(f"outbox row {row.id} refused: {refusal}")

    async def _call_temporal(self, row: OutboxRow) -> str | None:
        await self._refuse_unless_allowed(row)
        if row.kind == "start_workflow":
            assert row.workflow_type is not None
            try:
                handle = await self.client.start_workflow(
                    row.workflow_type,
                    *row.payload,
                    id=row.workflow_id,
                    task_queue=row.task_queue or self.default_task_queue,
                    # A relay retry must find the first run, never start a second one.
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                )
            except WorkflowAlreadyStartedError as already:
                return already.run_id
            return handle.result_run_id
        assert row.signal_name is not None
        payloads = await self.client.data_converter.encode(row.payload)
        try:
            await self.client.workflow_service.signal_workflow_execution(
                SignalWorkflowExecutionRequest(
                    namespace=self.client.namespace,
                    workflow_execution=WorkflowExecution(workflow_id=row.workflow_id),
                    signal_name=row.signal_name,
                    input=Payloads(payloads=payloads),
                    identity=self.client.identity,
                    # The server drops a signal whose request ID it has seen: exactly once.
                    request_id=row.request_id,
                )
            )
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                raise RuntimeError(f"no running workflow {row.workflow_id!r} to signal") from None
            raise
        return None

    async def pending(self) -> int:
        count: int = await self.pool.fetchval(self.queries["count_pending_outbox"])
        return count

    async def run(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        """The worker's relay loop: sweep until `stop` is set."""
        loop = asyncio.get_running_loop()
        backlog_due = loop.time()
        while not stop.is_set():
            try:
                done = await self.sweep()
                if self.metrics is not None and loop.time() >= backlog_due:
                    self.metrics.backlog.set(await self.pending())
                    backlog_due = loop.time() + BACKLOG_EVERY_SECONDS
            except Exception as error:  # the database may be restarting: try again soon
                log.warning("outbox sweep failed: %s", error)
                done = 0
            if done < BATCH:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)


async def ensure_sweep_schedule(
    client: Client, task_queue: str, every: timedelta = SWEEP_EVERY
) -> None:
    """Create or update the Temporal Schedule that starts OutboxSweep every `every`.

    Created once, kept; one made with another interval (procbus used to sweep every minute) or
    for another task queue (the workers moved to a new one) is brought up to date, and a sweep
    it left open on the old queue is ended.
    """
    spec = ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)])
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            OUTBOX_SWEEP,
            SweepRequest(limit=1000),
            id="procbus-outbox-sweep-run",
            task_queue=task_queue,
            static_summary="procbus: perform committed outbox rows that no relay performed",
        ),
        spec=spec,
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(SWEEP_SCHEDULE_ID, schedule)
        return
    except ScheduleAlreadyRunningError:  # created by an earlier start
        pass
    handle = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
    existing = await handle.describe()
    action = existing.schedule.action
    same_queue = isinstance(action, ScheduleActionStartWorkflow) and action.task_queue == task_queue
    if same_queue and [interval.every for interval in existing.schedule.spec.intervals] == [every]:
        return

    def brought_up_to_date(current: ScheduleUpdateInput) -> ScheduleUpdate:
        current.description.schedule.spec = spec
        current.description.schedule.action = schedule.action  # the task queue of this worker
        return ScheduleUpdate(schedule=current.description.schedule)

    await handle.update(brought_up_to_date)
    if not same_queue:
        # A sweep the schedule started on the old queue may never run there, and with SKIP an
        # open run skips every later one; sweeps are idempotent, so the next does its work.
        for running in existing.info.running_actions:
            if not isinstance(running, ScheduleActionExecutionStartWorkflow):
                continue
            with contextlib.suppress(RPCError):  # it ended meanwhile
                await client.get_workflow_handle(running.workflow_id).terminate(
                    f"the outbox sweep schedule moved to task queue {task_queue!r}"
                )

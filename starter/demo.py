"""`procbus demo`: the main job, end to end on a running stack or on one it starts itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import date, timedelta
from typing import TYPE_CHECKING

import asyncpg
from pydantic import BaseModel, Field
from rich.text import Text
from standardwebhooks.webhooks import Webhook
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from procbus.bus.member import BusMember
from procbus.capture import Captures
from procbus.config import Settings
from procbus.core.faults import parse_faults
from procbus.core.names import table_resource
from procbus.db import create_pool
from procbus.db.queries import load_queries
from procbus.delivery.factory import endpoint_check
from procbus.delivery.kafka import read_committed
from procbus.delivery.owner import delivery_workflow_id, ensure_delivery
from procbus.delivery.sync import send_now
from procbus.errors import ConfigError, InvalidRequest, ProcbusError, StackError
from procbus.hooks import TransactionAborted, transaction
from procbus.hooks.outbox import OutboxRelay
from procbus.lakehouse import warehouse
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.lakehouse.catalog import Catalog
from procbus.lakehouse.data import CompactTableInput, LoadTableInput
from procbus.lakehouse.models import (
    ChangeAccessInput,
    CreateNamespaceInput,
    CreateTableInput,
    DeleteNamespaceInput,
    DeleteTableInput,
)
from procbus.lakehouse.reader import read_snapshot, read_snapshot_table, same_rows
from procbus.locks import LockTable
from procbus.pipeline import Pipelines
from procbus.plugin.extension import ProcbusPlugin
from procbus.procedures import ProcedureState, ProcedureStatus
from procbus.procedures.client import pending_details, procedure_status
from procbus.procedures.schedules import procedure_schedule
from procbus.spark.backends import JobProgress
from procbus.stack.addresses import ServiceAddresses, resolve_addresses
from procbus.stack.check import StackCheckInput, StackCheckResult
from procbus.stack.embedded import EmbeddedServices
from procbus.stack.kafka import KafkaBroker
from procbus.stack.temporal_server import run_temporal_cli, temporal_cli_environment
from procbus.starter.demo_scenes import DEMO_STEPS, NEEDS_CREATE_TABLE
from procbus.starter.output import console, styled
from procbus.starter.receiver import WebhookReceiver
from procbus.temporal import connect_client, workflow_ui_url
from procbus.temporal.auth import Signer, client_signer, signed_client
from procbus.topics import Event, Topics, TopicSettings, TopicStats
from procbus.worker import build_worker
from procbus.worker.extensions import load_user_procedures
from procbus.worker.main import WORKFLOWS, bus_member, dev_worker_auth
from procbus.workflows.access import ChangeAccess
from procbus.workflows.data import CompactTable, LoadTable
from procbus.workflows.namespaces import CreateNamespace, DeleteNamespace
from procbus.workflows.stack_check import StackCheck
from procbus.workflows.tables import CreateTable, DeleteTable

# The drill: refresh_cache (step 3 of CreateTable) fails on a worker with this fault injected.
# It is a broadcast: the drill's own bus member refuses it, so every member is sent abort.
DRILL_FAULT = "CreateTable.refresh_cache.apply:fail_before"
# The table data scene: three loads of this many rows, then one compaction of their files.
DEMO_LOADS = 3
DEMO_ROWS_PER_LOAD = 300_000
# The pipeline scene: accounts of this opening balance, transfers between them by writers.
DEMO_ACCOUNTS = 10
DEMO_OPENING = 1_000
DEMO_WRITERS = 4
DEMO_TRANSFERS_EACH = 25
# The own-procedure scene: a user's module, imported from the working folder as
# `procbus worker --workflows` does (make demo runs from the project's folder).
USER_PROCEDURES = "examples.user_procedures"
# The locks scene: CreateTable is slow in create_layout, long enough to be waited for.
SLOW_FAULT = "CreateTable.create_layout:delay=3"
# The locks scene's DeleteTable waits at its last step, past its pivot, for its locks to be
# taken from it.
LATE_EVENT_FAULT = "DeleteTable.record_event:delay_first=4"

if TYPE_CHECKING:
    import pyarrow


def demo_steps(only: list[str] | None) -> list[str]:
    """The scenes to run: all of them, or those named (with what they need); InvalidRequest
    naming an unknown one."""
    if not only:
        return list(DEMO_STEPS)
    named = {step.strip() for item in only for step in item.split(",") if step.strip()}
    unknown = sorted(named - set(DEMO_STEPS))
    if unknown:
        raise InvalidRequest(
            f"no demo step {', '.join(map(repr, unknown))}: choose from {', '.join(DEMO_STEPS)}"
        )
    if named & NEEDS_CREATE_TABLE:
        named.add("create-table")
    return [step for step in DEMO_STEPS if step in named]


def read_with_pyiceberg(database_url: str, namespace: str, table: str, day: date) -> pyarrow.Table:
    """A day's rows of a table as a user reads them with pyiceberg alone
    (docs/concepts/table-format.md): the partition's files only."""
    from pyiceberg.catalog.sql import SqlCatalog

    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    loaded = SqlCatalog("procbus", uri=uri).load_table(f"{namespace}.{table}")
    return loaded.scan(row_filter=f"dt == '{day.isoformat()}'").to_arrow()


class DemoProcedure(BaseModel):
    procedure_id: str
    url: str | None
    status: ProcedureStatus


class DemoHooks(BaseModel):
    committed_hook_result: str
    committed_workflow_id: str
    committed_workflow_run_id: str | None
    rolled_back_hook_error: str
    rolled_back_workflow_started: bool
    outbox_rows_of_rolled_back: int


class DemoLocks(BaseModel):
    create_table_id: str
    create_table_state: ProcedureState
    delete_namespace_id: str
    waiting_for: list[str]
    lock_table_while_waiting: list[str]
    delete_namespace_state: ProcedureState
    delete_namespace_error: str | None
    lost_locks_delete_table_id: str
    lost_locks_delete_table_state: ProcedureState
    locks_taken_again: list[str]


class DemoBadInput(BaseModel):
    workflow_id: str
    temporal_cli_exit_code: int
    error_type: str
    error: str


class DemoTopics(BaseModel):
    topic: str
    published: int
    failed_attempts_while_down: int
    delivered_once_each: bool
    key_order_kept: bool
    signatures_verified: int
    delivered_while_a_key_failed: int
    dead_letter_id: int
    redriven_with_its_webhook_id: bool


class DemoGroupedBatches(BaseModel):
    topic: str
    batch_size: int
    batch_events: int
    transaction_whole: bool
    batch_id: str
    sync_ack: str
    sync_nack_error: str | None


class DemoKafka(BaseModel):
    topic: str
    kafka_topic: str
    broker: str
    transaction_events: int
    seen_by_read_committed: int
    one_batch_id: bool
    keys_in_order: bool


class DemoAccess(BaseModel):
    grant_id: str
    revoke_id: str
    granted: dict[str, str] = Field(description="worker -> its outcome of the grant")
    revoked: dict[str, str] = Field(description="worker -> its outcome of the revoke")
    grants_left_on_workers: dict[str, int]
    refused_delete_error: str


class DemoTableData(BaseModel):
    table: str
    load_ids: list[str]
    rows: int
    files_before: int
    compaction_id: str
    progress_seen: list[str]
    files_after: int
    same_rows_after: bool
    snapshots: list[str] = Field(description="newest first: ID and operation")
    schedule_id: str
    schedule_next_run: str | None


class DemoPipeline(BaseModel):
    source_table: str
    lake_table: str
    topic: str
    snapshot_rows: int
    transfers_committed: int
    transfers_rolled_back: int
    lake_snapshots_read: int
    lake_totals_seen: list[int] = Field(description="each distinct total a reader saw")
    expected_total: int
    batches_applied: int
    transactions_applied: int
    lake_equals_source: bool


class DemoOwnProcedure(BaseModel):
    module: str
    task_queue: str
    procedure_id: str
    state: ProcedureState
    broadcast_reached: list[str] = Field(description="the workers that dropped the table")
    refused_id: str
    refused_state: ProcedureState
    notes_after_rollback: list[str] = Field(description="the user's system: one note, kept")
    rows_counted: int | None = Field(description="the rows its Spark job step counted")


class DemoReport(BaseModel):
    """What the demo showed; a scene left out by `--only` is None."""

    started_stack: bool
    temporal_address: str
    ui_url: str | None
    steps: list[str]
    stack_check_workflow_id: str
    stack_check_url: str | None
    stack_check: StackCheckResult
    create_table: DemoProcedure | None = None
    failed_create_table: DemoProcedure | None = None
    residue_after_rollback: list[str] | None = None
    hooks: DemoHooks | None = None
    locks: DemoLocks | None = None
    bad_input: DemoBadInput | None = None
    topics: DemoTopics | None = None
    grouped: DemoGroupedBatches | None = None
    kafka: DemoKafka | None = None
    access: DemoAccess | None = None
    table_data: DemoTableData | None = None
    pipeline: DemoPipeline | None = None
    own_procedure: DemoOwnProcedure | None = None
    metrics_url: str | None


@contextlib.asynccontextmanager
async def _stack(settings: Settings) -> AsyncIterator[tuple[ServiceAddresses, bool]]:
    """The running stack, or an embedded one started for the demo and stopped after it."""
    try:
        running = resolve_addresses(settings)
    except StackError:
        if settings.temporal_address or settings.database_url:
            raise
    else:
        yield running, False
        return
    async with EmbeddedServices(settings):
        yield resolve_addresses(settings), True


@contextlib.contextmanager
def expected_activity_failures() -> Iterator[None]:
    """The demo's failures are expected: no warning with a traceback for them."""
    activity_log = logging.getLogger("temporalio.activity")
    level = activity_log.level
    activity_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        activity_log.setLevel(level)


class DemoRollback(Exception):
    """Raised inside the demo's second transaction to roll it back."""


class Demo:
    def __init__(
        self,
        settings: Settings,
        services: ServiceAddresses,
        client: Client,
        pool: asyncpg.Pool,
        quiet: bool,
    ) -> None:
        self.settings = settings
        self.services = services
        self.client = client
        self.pool = pool
        self.quiet = quiet
        self.run_id = uuid.uuid4().hex[:6]
        # The dev stack's: its key in the state folder, the dev operator for what is unsigned.
        self.auth = dev_worker_auth(settings)
        self.members: list[BusMember] = []  # this process's bus members: "every worker" here

    def say(self, message: str | Text) -> None:
        if not self.quiet:
            console.print(message, highlight=False)

    def url(self, workflow_id: str) -> str | None:
        return workflow_ui_url(self.services.ui_url, self.services.namespace, workflow_id)

    def show_steps(self, status: ProcedureStatus) -> None:
        undone = set(status.compensations_done)
        for step in status.steps_done:
            self.say(f"     {step:<16} done" + (", then undone" if step in undone else ""))
        if status.failed_step:
            failed = status.failed_step
            undone_note = ", its undo ran too" if failed in undone else ""
            self.say(f"     {failed:<16} FAILED ({status.error}){undone_note}")
        for step, broadcast in status.broadcasts.items():
            self.say(f"       {step} on the workers: {broadcast.summary()}")

    async def stack_check(self) -> tuple[str, StackCheckResult]:
        workflow_id = f"demo-stack-check-{self.run_id}"
        self.say(f"1. StackCheck {workflow_id}: a worker writes to PostgreSQL, reads back")
        result = await self.client.execute_workflow(
            StackCheck.run,
            StackCheckInput(check_id=workflow_id, message="hello from procbus demo"),
            id=workflow_id,
            task_queue=self.services.task_queue,
            static_summary="procbus demo: stack check",
        )
        self.say(
            f"   row {result.row_id} written by {result.worker} at {result.written_at:%X} and "
            f"read back ({result.total_checks} checks in the database)"
        )
        return workflow_id, result

    async def create_table(self, namespace: str) -> DemoProcedure:
        self.say(f"2. CreateNamespace {namespace}, then CreateTable {namespace}.orders")
        await self.client.execute_workflow(
            CreateNamespace.run,
            CreateNamespaceInput(namespace=namespace),
            id=f"demo-create-namespace-{self.run_id}",
            task_queue=self.services.task_queue,
            static_summary=f"procbus demo: namespace {namespace}",
        )
        procedure_id = f"demo-create-table-{self.run_id}"
        await self.client.execute_workflow(
            CreateTable.run,
            CreateTableInput(
                table=f"{namespace}.orders",
                columns="id:bigint,amount:decimal(12,2),dt:date",
                partition_by=["dt"],
            ),
            id=procedure_id,
            task_queue=self.services.task_queue,
            static_summary=f"procbus demo: CreateTable {namespace}.orders",
        )
        status = await procedure_status(self.client, procedure_id)
        self.say(f"   {procedure_id}: {status.state.value}")
        self.show_steps(status)
        if status.state is not ProcedureState.SUCCEEDED:
            raise ProcbusError(f"demo: {procedure_id} ended {status.state.value}")
        return DemoProcedure(procedure_id=procedure_id, url=self.url(procedure_id), status=status)

    async def failed_create_table(self, namespace: str) -> tuple[DemoProcedure, list[str]]:
        table = f"{namespace}.returns"
        self.say(f"3. CreateTable {table} on a worker where step 3 (refresh_cache) fails")
        drill_queue = f"{self.services.task_queue}-demo-drill-{self.run_id}"
        procedure_id = f"demo-create-table-rollback-{self.run_id}"
        cache = DescriptorCache()
        faults = parse_faults(DRILL_FAULT)
        with expected_activity_failures():
            async with (
                build_worker(
                    self.client,
                    self.pool,
                    drill_queue,
                    warehouse_root=self.settings.warehouse_root,
                    faults=faults,
                    auth=self.auth,
                ),
                bus_member(
                    self.client,
                    self.pool,
                    drill_queue,
                    tables=cache,
                    access=AccessCache(),
                    member_id=f"demo-{self.run_id}-drill",
                    faults=faults,
                ) as drill_member,
            ):
                # Expected to fail: the status below says how it ended.
                with contextlib.suppress(WorkflowFailureError):
                    await self.client.execute_workflow(
                        CreateTable.run,
                        CreateTableInput(table=table, columns="id:bigint,reason:string"),
                        id=procedure_id,
                        task_queue=drill_queue,
                        static_summary=f"procbus demo: CreateTable {table}, rolled back",
                    )
                status = await procedure_status(self.client, procedure_id)
        self.say(f"   {procedure_id}: {status.state.value}")
        self.show_steps(status)
        residue = await self.residue(namespace, "returns", procedure_id)
        for member in [*self.members, drill_member]:
            if member.tables.get(table) is not None:
                residue.append(f"cache entry on {member.member_id}")
        if status.state is not ProcedureState.ROLLED_BACK or residue:
            raise ProcbusError(f"demo: rollback of {procedure_id} left {residue or status.state}")
        self.say("   no residue: not in the catalog, no folder, no event, in no worker's cache")
        drill = DemoProcedure(procedure_id=procedure_id, url=self.url(procedure_id), status=status)
        return drill, residue

    async def hooks(self) -> DemoHooks:
        self.say("4. Post-commit hooks and the durable outbox")
        relay = OutboxRelay(self.client, self.pool, self.services.task_queue)
        committed_id = f"demo-outbox-committed-{self.run_id}"
        rolled_back_id = f"demo-outbox-rolled-back-{self.run_id}"

        async def notify(check_id: str) -> str:
            return f"notified the team about {check_id}"

        async with self.pool.acquire() as connection:
            async with transaction(connection, relay=relay) as tx:
                await connection.execute(
                    load_queries("procbus.stack")["insert_stack_check"],
                    committed_id,
                    "committed",
                    "demo",
                )
                notified = tx.post_commit(notify, committed_id)
                started = await tx.start_workflow(
                    StackCheck,
                    StackCheckInput(check_id=committed_id),
                    id=committed_id,
                    task_queue=self.services.task_queue,
                )
            hook_result = await notified
            run_id = await started
            self.say(f"   committed: hook ran ({hook_result}); workflow {committed_id} started")
            await self.client.get_workflow_handle(committed_id).result()

            with contextlib.suppress(DemoRollback):
                async with transaction(connection, relay=relay) as tx:
                    await connection.execute(
                        load_queries("procbus.stack")["insert_stack_check"],
                        rolled_back_id,
                        "rolled back",
                        "demo",
                    )
                    cancelled = tx.post_commit(notify, rolled_back_id)
                    await tx.start_workflow(
                        StackCheck,
                        StackCheckInput(check_id=rolled_back_id),
                        id=rolled_back_id,
                        task_queue=self.services.task_queue,
                    )
                    raise DemoRollback("the order failed validation")
        try:
            await cancelled
            raise ProcbusError("demo: a hook of a rolled-back transaction ran")
        except TransactionAborted as aborted:
            reason = str(aborted)
        rows = await self.pool.fetchval(
            'SELECT count(*) FROM "procbus_outbox" WHERE "workflow_id" = $1', rolled_back_id
        )
        try:
            await self.client.get_workflow_handle(rolled_back_id).describe()
            started_anyway = True
        except RPCError:
            started_anyway = False
        if rows or started_anyway:
            raise ProcbusError("demo: the rolled-back transaction left an outbox row or a run")
        self.say(f"   rolled back: hook cancelled ({reason}); no workflow, no outbox row")
        return DemoHooks(
            committed_hook_result=hook_result,
            committed_workflow_id=committed_id,
            committed_workflow_run_id=run_id,
            rolled_back_hook_error=reason,
            rolled_back_workflow_started=started_anyway,
            outbox_rows_of_rolled_back=rows,
        )

    async def locks(self) -> DemoLocks:
        namespace = f"demo_locks_{self.run_id}"
        self.say(f"5. Locks: DeleteNamespace {namespace} waits for a running CreateTable in it")
        await self.client.execute_workflow(
            CreateNamespace.run,
            CreateNamespaceInput(namespace=namespace),
            id=f"demo-locks-namespace-{self.run_id}",
            task_queue=self.services.task_queue,
        )
        slow_queue = f"{self.services.task_queue}-demo-slow-{self.run_id}"
        create_id = f"demo-locks-create-table-{self.run_id}"
        delete_id = f"demo-locks-delete-namespace-{self.run_id}"
        with expected_activity_failures():
            async with build_worker(
                self.client,
                self.pool,
                slow_queue,
                warehouse_root=self.settings.warehouse_root,
                faults=parse_faults(f"{SLOW_FAULT},{LATE_EVENT_FAULT}"),
                auth=self.auth,
            ):
                creating = await self.client.start_workflow(
                    CreateTable.run,
                    CreateTableInput(table=f"{namespace}.events", columns="id:bigint,kind:string"),
                    id=create_id,
                    task_queue=slow_queue,
                    static_summary=f"procbus demo: CreateTable {namespace}.events (slow)",
                )
                await self._wait_until(create_id, lambda status: bool(status.locks))
                deleting = await self.client.start_workflow(
                    DeleteNamespace.run,
                    DeleteNamespaceInput(namespace=namespace),
                    id=delete_id,
                    task_queue=self.services.task_queue,
                    static_summary=f"procbus demo: DeleteNamespace {namespace}, waits for the lock",
                )
                waiting = await self._wait_until(
                    delete_id, lambda status: status.state is ProcedureState.WAITING
                )
                rows = [
                    f"{entry.resource} {entry.mode.value} {entry.holder} "
                    + (f"holding, token {entry.token}" if entry.granted else "waiting")
                    for entry in await LockTable(self.pool).list_locks()
                    if entry.holder in (create_id, delete_id)
                ]
                self.say(f"   {delete_id}: WAITING for {'; '.join(waiting.waiting_for)}")
                for row in rows:
                    self.say(f"     lock table: {row}")
                await creating.result()
                # Expected to be refused: by now the namespace holds the new table.
                with contextlib.suppress(WorkflowFailureError):
                    await deleting.result()
                created = await procedure_status(self.client, create_id)
                deleted = await procedure_status(self.client, delete_id)
                self.say(f"   {create_id}: {created.state.value}, then it released its locks")
                self.say(
                    f"   {delete_id} ran only then: {deleted.state.value} ({deleted.error}); "
                    "without the lock it would have deleted the namespace while CreateTable was "
                    "mid-way"
                )
                lost_id, lost = await self._locks_taken_past_the_pivot(
                    f"{namespace}.events", slow_queue
                )
        if created.state is not ProcedureState.SUCCEEDED or deleted.state.value == "SUCCEEDED":
            raise ProcbusError(f"demo: locks scene ended {created.state} / {deleted.state}")
        if lost.state is not ProcedureState.SUCCEEDED or not lost.locks_taken_again:
            raise ProcbusError(f"demo: the DeleteTable whose locks were taken ended {lost}")
        return DemoLocks(
            lost_locks_delete_table_id=lost_id,
            lost_locks_delete_table_state=lost.state,
            locks_taken_again=lost.locks_taken_again,
            create_table_id=create_id,
            create_table_state=created.state,
            delete_namespace_id=delete_id,
            waiting_for=waiting.waiting_for,
            lock_table_while_waiting=rows,
            delete_namespace_state=deleted.state,
            delete_namespace_error=deleted.error,
        )

    async def _locks_taken_past_the_pivot(
        self, table: str, task_queue: str
    ) -> tuple[str, ProcedureStatus]:
        """A DeleteTable past its pivot whose locks an operator releases, and another holder
        takes for a while: it queues for them again and finishes with new tokens."""
        delete_id = f"demo-locks-delete-table-{self.run_id}"
        locks = LockTable(self.pool)
        deleting = await self.client.start_workflow(
            DeleteTable.run,
            DeleteTableInput(table=table, lock_lease_seconds=3),
            id=delete_id,
            task_queue=task_queue,
            static_summary=f"procbus demo: DeleteTable {table}, its locks taken past its pivot",
        )
        await self._wait_until(delete_id, lambda status: status.step_running == "record_event")
        released = await locks.release_for(
            delete_id, None, "procbus demo", "the demo takes the locks of a running procedure"
        )
        self.say(
            f"   {delete_id}: past its pivot; an operator releases its locks "
            f"({', '.join(released.resources)}, `procbus lock release --force`), and a script "
            "holds the table's for 6 s"
        )
        resource = table_resource(*table.split("."))
        async with locks.holding(f"demo-script-{self.run_id}", [(resource, "X")]):
            await asyncio.sleep(6)
        await deleting.result()
        status = await procedure_status(self.client, delete_id)
        self.say(f"   {delete_id}: {status.state.value}; {'; '.join(status.locks_taken_again)}")
        return delete_id, status

    async def bad_input(self) -> DemoBadInput:
        workflow_id = f"demo-bad-input-{self.run_id}"
        self.say("6. Bad input from the temporal CLI: CreateTable with a misspelled field")
        async with asyncio.timeout(60):
            code, _, _ = await run_temporal_cli(
                "workflow",
                "execute",
                "--task-queue",
                self.services.task_queue,
                "--type",
                "CreateTable",
                "--workflow-id",
                workflow_id,
                "--input",
                '{"tabel": "sales.x", "columns": "id:int"}',
                env=temporal_cli_environment(
                    self.settings, self.services.temporal_address, self.services.namespace
                ),
            )
        try:
            await self.client.get_workflow_handle(workflow_id).result()
            raise ProcbusError("demo: a CreateTable with a misspelled field succeeded")
        except WorkflowFailureError as failed:
            cause = failed.cause
        if not isinstance(cause, ApplicationError) or code == 0:
            raise ProcbusError(f"demo: bad input ended {cause!r}, temporal exit code {code}")
        self.say(f"   `temporal workflow execute` exited {code}: FAILED at once, {cause.type}:")
        self.say(f"   {cause.message}")
        return DemoBadInput(
            workflow_id=workflow_id,
            temporal_cli_exit_code=code,
            error_type=str(cause.type),
            error=cause.message,
        )

    async def topics(self) -> DemoTopics:
        name = f"demo-orders-{self.run_id}"
        self.say("7. Persistent topics: a webhook endpoint down and back, a failing key, a redrive")
        receiver = WebhookReceiver()  # not listening yet: the endpoint is down
        topics = Topics(self.pool)
        _, secret = await topics.create(
            name, TopicSettings(endpoint=receiver.url, retry_sleep_seconds=0.2, max_retries=3)
        )
        await ensure_delivery(self.client, name, self.services.task_queue)
        try:
            published = [
                await topics.publish(
                    name,
                    Event(payload={"order": n % 3, "step": n // 3}, key=f"order-{n % 3}"),
                )
                for n in range(6)
            ]
            down = await self._until(topics, name, lambda stats: stats.blocked_keys == 3)
            self.say(
                f"   endpoint down: {down.depth} events wait, {down.retried} failed attempts so "
                f"far, {down.blocked_keys} keys held back"
            )
            receiver.up()
            await self._until(topics, name, lambda stats: stats.depth == 0)
            for accepted in receiver.accepted:
                Webhook(secret).verify(accepted.body, accepted.headers)
            ids = [accepted.headers["webhook-id"] for accepted in receiver.accepted]
            once = sorted(ids) == sorted(item.webhook_id for item in published)
            events = receiver.events()
            in_order = all(
                [e["data"]["step"] for e in events if e["key"] == f"order-{k}"] == [0, 1]
                for k in range(3)
            )
            self.say(
                f"   endpoint back: all {len(events)} delivered, each once (by webhook-id), in "
                f"order per key, {len(receiver.accepted)} signatures verified"
            )
            receiver.failing = {"order-bad"}
            bad = await topics.publish(name, Event(payload={"order": "bad"}, key="order-bad"))
            for n in range(3):
                await topics.publish(name, Event(payload={"order": 10 + n}, key=f"order-{10 + n}"))
            failing = await self._until(topics, name, lambda stats: stats.dead_letters == 1)
            meanwhile = len(receiver.events()) - len(events)
            [dead] = await topics.dead_letters(name)
            self.say(
                f"   order-bad fails; the {meanwhile} events of other keys went meanwhile; after "
                f"{dead.attempts} attempts it is dead letter {dead.id} ({failing.dead_letters} "
                "kept, nothing dropped)"
            )
            receiver.failing = set()
            await topics.redrive(name, [dead.id])
            await self._until(topics, name, lambda stats: stats.depth == 0)
            redriven = receiver.accepted[-1].headers["webhook-id"] == bad.webhook_id
            self.say(f"   redriven: delivered with its original webhook-id ({bad.webhook_id})")
            if not (once and in_order and redriven and meanwhile == 3):
                raise ProcbusError("demo: the topic scene did not deliver as it should")
            return DemoTopics(
                topic=name,
                published=len(published) + 4,
                failed_attempts_while_down=down.retried,
                delivered_once_each=once,
                key_order_kept=in_order,
                signatures_verified=len(receiver.accepted),
                delivered_while_a_key_failed=meanwhile,
                dead_letter_id=dead.id,
                redriven_with_its_webhook_id=redriven,
            )
        finally:
            receiver.down()
            await topics.delete(name, force=True)  # its delivery workflow ends with it

    async def grouped_batches(self) -> DemoGroupedBatches:
        name = f"demo-ledger-{self.run_id}"
        self.say("8. Grouped batches: a batch grows past its size to keep a transaction whole")
        receiver = WebhookReceiver()
        receiver.up()
        topics = Topics(self.pool)
        batch_size = 3
        await topics.create(
            name,
            TopicSettings(
                endpoint=receiver.url + "?batch=1", group_transactions=True, batch_size=batch_size
            ),
        )
        direct = f"demo-direct-{self.run_id}"
        try:
            async with self.pool.acquire() as connection, transaction(connection) as tx:
                for account in range(5):  # one transfer touching five accounts
                    await tx.publish(name, {"account": account, "moved": 10}, key=f"acct-{account}")
            await ensure_delivery(self.client, name, self.services.task_queue)
            await self._until(topics, name, lambda stats: stats.depth == 0)
            [batch] = receiver.accepted
            events = batch.events
            txn = events[-1].get("transaction") or {}
            whole = txn.get("last") is True and txn.get("size") == len(events)
            batch_id = batch.headers["procbus-batch-id"]
            self.say(
                f"   a transaction of 5 events, batch size {batch_size}: one batch of "
                f"{len(events)} events, the transaction whole (batch-id {batch_id})"
            )
            topics = Topics(self.pool, send_now=send_now)  # it sends a --sync topic's events
            await topics.create(direct, TopicSettings(endpoint=receiver.url, sync=True))
            ack = await topics.publish(direct, Event(payload={"note": "sent now"}))
            receiver.down()
            nack = await topics.publish(direct, Event(payload={"note": "lost"}), timeout_seconds=2)
            self.say(
                f"   a --sync topic sends in the call: {ack.delivery.upper()}; endpoint down: "
                f"{nack.delivery.upper()} ({nack.error}), nothing queued"
            )
            if not (whole and len(events) == 5 and ack.delivery == "ack"):
                raise ProcbusError("demo: the grouped batch did not arrive whole")
            return DemoGroupedBatches(
                topic=name,
                batch_size=batch_size,
                batch_events=len(events),
                transaction_whole=whole,
                batch_id=batch_id,
                sync_ack=ack.delivery,
                sync_nack_error=nack.error,
            )
        finally:
            receiver.down()
            await topics.delete(name, force=True)
            with contextlib.suppress(ProcbusError):
                await topics.delete(direct, force=True)

    async def kafka(self) -> DemoKafka:
        name = f"demo-kafka-{self.run_id}"
        kafka_topic = f"ledger-{self.run_id}"
        self.say(
            "9. Kafka: a grouped topic's batch is one Kafka transaction, read back by a "
            "read_committed consumer"
        )
        with KafkaBroker(self.settings.state_dir.resolve() / "kafka") as broker:
            endpoint = f"kafka://{broker.bootstrap}/{kafka_topic}?create=1&partitions=2"
            # As `procbus topic create` does: the cluster is asked first (?create=1 makes the
            # Kafka topic).
            topics = Topics(self.pool, check_endpoint=endpoint_check())
            await topics.create(name, TopicSettings(endpoint=endpoint, group_transactions=True))
            try:
                async with self.pool.acquire() as connection, transaction(connection) as tx:
                    for step in range(6):  # one transfer: three accounts, two entries each
                        await tx.publish(name, {"step": step, "moved": 10}, key=f"acct-{step % 3}")
                await ensure_delivery(self.client, name, self.services.task_queue)
                await self._until(topics, name, lambda stats: stats.depth == 0)
                read = await asyncio.to_thread(
                    read_committed, broker.bootstrap, kafka_topic, 6, timeout_seconds=30
                )
                batch_ids = {message.headers.get("procbus-batch-id") for message in read}
                order: dict[str, list[int]] = {}
                for message in read:
                    order.setdefault(message.key or "", []).append(message.value["data"]["step"])
                in_order = all(steps == sorted(steps) for steps in order.values())
                self.say(
                    f"   {broker.bootstrap} (a Kafka-protocol broker of the demo's own): a "
                    f"transaction of 6 events went as one Kafka transaction (batch-id "
                    f"{batch_ids.pop() if len(batch_ids) == 1 else batch_ids}); a read_committed "
                    f"consumer read {len(read)}, each account's in order: {in_order}"
                )
                if len(read) != 6 or not in_order:
                    raise ProcbusError("demo: the Kafka transaction was not read back whole")
                return DemoKafka(
                    topic=name,
                    kafka_topic=kafka_topic,
                    broker=broker.bootstrap,
                    transaction_events=6,
                    seen_by_read_committed=len(read),
                    one_batch_id=len({m.headers.get("procbus-batch-id") for m in read}) == 1,
                    keys_in_order=in_order,
                )
            finally:
                await topics.delete(name, force=True)  # its delivery workflow ends with it
                # Ended before the broker stops, so its producer never calls a broker gone.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(15):
                        await self.client.get_workflow_handle(delivery_workflow_id(name)).result()

    async def _until(
        self, topics: Topics, name: str, condition: Callable[[TopicStats], bool]
    ) -> TopicStats:
        async with asyncio.timeout(60):
            while True:
                stats = await topics.stats(name)
                if condition(stats):
                    return stats
                await asyncio.sleep(0.1)

    async def _wait_until(
        self, procedure_id: str, condition: Callable[[ProcedureStatus], bool]
    ) -> ProcedureStatus:
        async with asyncio.timeout(60):
            while True:
                with contextlib.suppress(ProcbusError):  # not started yet
                    status = await procedure_status(self.client, procedure_id)
                    if condition(status):
                        return status
                await asyncio.sleep(0.1)

    async def access(self, namespace: str) -> DemoAccess:
        table = f"{namespace}.orders"
        self.say(f"10. Notification bus: grant, then revoke, write on {table} on every worker")
        outcomes: dict[str, dict[str, str]] = {}
        ids = {}
        for action in ("grant", "revoke"):
            procedure_id = ids[action] = f"demo-acl-{action}-{self.run_id}"
            result = await self.client.execute_workflow(
                ChangeAccess.run,
                ChangeAccessInput(action=action, principal="etl", table=table, permission="write"),
                id=procedure_id,
                task_queue=self.services.task_queue,
                static_summary=f"procbus demo: {action} etl write on {table}",
            )
            outcomes[action] = {m.member_id: m.outcome.value for m in result.members}
            holding = [m for m in self.members if m.access.allows(result.entry)]
            if len(holding) != (len(self.members) if action == "grant" else 0):
                raise ProcbusError(f"demo: {action} reached {len(holding)} workers' caches")
            self.say(
                f"   {procedure_id}: "
                + ", ".join(f"{member} {outcome}" for member, outcome in outcomes[action].items())
            )
        left = {
            member.member_id: sum(1 for e in member.access.entries() if e.principal == "etl")
            for member in self.members
        }
        if any(left.values()) or not outcomes["revoke"]:
            raise ProcbusError(f"demo: the revoke left grants on the workers: {left}")
        self.say(
            f"   on all {len(left)} workers of this demo the revoke took effect (prepared "
            "everywhere first; had one failed, all would have aborted)"
        )
        refused_id = f"demo-acl-refused-delete-{self.run_id}"
        assert self.auth.key is not None  # dev_worker_auth always gives one
        as_etl = signed_client(self.client, Signer(self.auth.key, "etl"))
        with expected_activity_failures(), contextlib.suppress(WorkflowFailureError):
            await as_etl.execute_workflow(
                DeleteTable.run,
                DeleteTableInput(table=table),
                id=refused_id,
                task_queue=self.services.task_queue,
                static_summary=f"procbus demo: DeleteTable {table} as etl, refused",
            )
        refused = await procedure_status(self.client, refused_id)
        if refused.state is not ProcedureState.ROLLED_BACK or "AccessDenied" not in (
            refused.error or ""
        ):
            raise ProcbusError(f"demo: etl's DeleteTable after the revoke: {refused.state}")
        self.say(f"   DeleteTable {table} as etl now: {refused.state.value} ({refused.error})")
        return DemoAccess(
            grant_id=ids["grant"],
            revoke_id=ids["revoke"],
            granted=outcomes["grant"],
            revoked=outcomes["revoke"],
            grants_left_on_workers=left,
            refused_delete_error=refused.error or "",
        )

    async def table_data(self, namespace: str) -> DemoTableData:
        table = f"{namespace}.orders"
        self.say(
            f"11. Table data on Spark: load {table} from three files, read it, compact it (its "
            "progress shown), read it again, and a Schedule"
        )
        # Under a folder the workers load from (WAREHOUSE/incoming unless PROCBUS_LOAD_ROOTS).
        inputs = self.settings.load_root_paths[0] / "demo" / self.run_id
        inputs.mkdir(parents=True, exist_ok=True)
        load_ids = []
        for number in range(DEMO_LOADS):
            source = inputs / f"orders-{number}.csv"
            first = number * DEMO_ROWS_PER_LOAD
            source.write_text(
                "id,amount,dt\n"
                + "".join(
                    f"{row},{row % 1000}.{row % 100:02d},2026-11-{21 + row % 3}\n"
                    for row in range(first, first + DEMO_ROWS_PER_LOAD)
                )
            )
            procedure_id = f"demo-load-{number + 1}-{self.run_id}"
            loaded = await self.client.execute_workflow(
                LoadTable.run,
                LoadTableInput(table=table, source=str(source)),
                id=procedure_id,
                task_queue=self.services.task_queue,
                static_summary=f"procbus demo: load {source.name} into {table}",
            )
            load_ids.append(procedure_id)
            self.say(
                f"   {procedure_id}: snapshot {loaded.snapshot_id}, {loaded.records} rows in "
                f"{loaded.files_added} files (write staged by Spark, then one catalog commit)"
            )
        catalog = Catalog(self.pool)
        before = await catalog.table_files(namespace, "orders")
        # As Arrow tables: every loaded row compared, without a Python object for each.
        rows_before = await asyncio.to_thread(read_snapshot_table, before)
        first_row = rows_before.slice(0, 1).to_pylist()[0]
        self.say(
            f"   read snapshot {before.snapshot_id}: {rows_before.num_rows} rows in "
            f"{len(before.files)} files; first row "
            + ", ".join(f"{name}={value}" for name, value in first_row.items())
        )
        compaction_id = f"demo-compact-{self.run_id}"
        handle = await self.client.start_workflow(
            CompactTable.run,
            CompactTableInput(table=table, target_file_size=64 * 1024 * 1024),
            id=compaction_id,
            task_queue=self.services.task_queue,
            static_summary=f"procbus demo: compact {table}",
        )
        seen: list[str] = []
        while True:  # the Spark job's progress, from its heartbeat (the UI shows the same)
            with contextlib.suppress(RPCError):
                for step, details in (await pending_details(self.client, compaction_id)).items():
                    line = f"{step}: {JobProgress.model_validate(details).line()}"
                    if line not in seen:
                        seen.append(line)
                        self.say(f"     {line}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    compacted = await handle.result()
                    break
        status = await procedure_status(self.client, compaction_id)
        self.show_steps(status)
        if not seen:
            raise ProcbusError("demo: the compaction's progress was never seen")
        after = await catalog.table_files(namespace, "orders")
        rows_after = await asyncio.to_thread(read_snapshot_table, after)
        same = await asyncio.to_thread(same_rows, rows_after, rows_before)
        if not same or compacted.snapshot_id != after.snapshot_id:
            raise ProcbusError("demo: the compaction changed the table's rows")
        self.say(
            f"   read snapshot {after.snapshot_id}: the same {rows_after.num_rows} rows, now in "
            f"{len(after.files)} files (the {compacted.files_removed} replaced files stay for "
            "time travel until their snapshots expire)"
        )
        snapshots = [
            f"{snapshot.snapshot_id} {snapshot.operation}"
            for snapshot in await catalog.list_snapshots(namespace, "orders")
        ]
        self.say(f"   snapshots, newest first: {', '.join(snapshots)}")
        day = first_row["dt"]
        by_iceberg = await asyncio.to_thread(
            read_with_pyiceberg, self.services.database_url, namespace, "orders", day
        )
        # The same columns in the same Arrow types (pyiceberg's carry field IDs as metadata).
        by_iceberg = by_iceberg.select(rows_after.schema.names).cast(rows_after.schema)
        import pyarrow.compute as compute  # loads where table data is compared

        ours = rows_after.filter(compute.equal(rows_after.column("dt"), day))
        if not await asyncio.to_thread(same_rows, by_iceberg, ours):
            raise ProcbusError("demo: pyiceberg read other rows than procbus's reader")
        self.say(
            f"   an Iceberg table: pyiceberg's own SqlCatalog on this database (no procbus code) "
            f"reads partition dt={day}, its files alone: the same {by_iceberg.num_rows} rows"
        )
        schedule_id = f"demo-compact-{namespace}"
        runs_id, compact = f"compact-{table}-{schedule_id}", CompactTableInput(table=table)
        signer = client_signer(self.settings)
        schedule = await self.client.create_schedule(
            schedule_id,
            procedure_schedule(
                "CompactTable",
                compact,
                target=table,
                workflow_id=runs_id,
                task_queue=self.services.task_queue,
                every=timedelta(hours=1),
                note="created by procbus demo",
                # Its runs are signed as the demo's principal, as `procbus schedule create` does.
                headers=signer.schedule_headers(runs_id, "CompactTable", compact)
                if signer
                else None,
            ),
        )
        described = await schedule.describe()
        next_runs = described.info.next_action_times
        next_run = f"{next_runs[0]:%Y-%m-%d %H:%M} UTC" if next_runs else None
        self.say(
            f"   Schedule {schedule_id}: CompactTable {table} every hour (overlap skip, pause on "
            f"failure); next run {next_run}; `procbus schedule list` and the UI's Schedules page"
        )
        return DemoTableData(
            table=table,
            load_ids=load_ids,
            rows=rows_after.num_rows,
            files_before=len(before.files),
            compaction_id=compaction_id,
            progress_seen=seen,
            files_after=len(after.files),
            same_rows_after=same,
            snapshots=snapshots,
            schedule_id=schedule_id,
            schedule_next_run=next_run,
        )

    async def pipeline(self, namespace: str) -> DemoPipeline:
        source = "procbus_demo_accounts"
        bank = load_queries("procbus.starter")
        lake_table = f"{namespace}.accounts"
        topic = f"demo-pipeline-{self.run_id}"
        total = DEMO_ACCOUNTS * DEMO_OPENING
        self.say(
            f"12. Change pipeline: the application's table {source} captured, transfers "
            f"applied to the Iceberg table {lake_table} in the worker (Arrow), each "
            "source transaction whole"
        )
        await self.pool.execute(bank["create_accounts"])
        await self.pool.execute(bank["open_accounts"], DEMO_OPENING, DEMO_ACCOUNTS)
        await self.client.execute_workflow(
            CreateTable.run,
            CreateTableInput(table=lake_table, columns="id:bigint,owner:string,balance:bigint"),
            id=f"demo-create-accounts-{self.run_id}",
            task_queue=self.services.task_queue,
        )
        topics, captures = Topics(self.pool), Captures(self.pool)
        await topics.create(
            topic,
            TopicSettings(endpoint=f"table://{lake_table}", group_transactions=True, batch_size=10),
        )
        try:
            capture = await captures.create(source, topic)
            self.say(
                f"   capture {capture.source} into topic {topic} (endpoint table://{lake_table}):"
                f" its {capture.snapshot_rows} rows published as one snapshot transaction"
            )
            await ensure_delivery(self.client, topic, self.services.task_queue)
            totals: dict[int, int] = {}
            writing = asyncio.gather(
                *(demo_transfers(self.pool, seed) for seed in range(DEMO_WRITERS))
            )
            pipelines = Pipelines(self.pool)
            catalog = Catalog(self.pool)
            while True:  # a lake reader, polling while the transfers run and are applied
                snapshot = await catalog.table_files(namespace, "accounts")
                if snapshot.snapshot_id is not None and snapshot.snapshot_id not in totals:
                    rows = await asyncio.to_thread(read_snapshot, snapshot)
                    totals[snapshot.snapshot_id] = sum(row["balance"] for row in rows)
                status = await pipelines.status(topic)
                if writing.done() and status.lag_changes == 0:
                    break
                if status.state != "running":
                    raise ProcbusError(f"demo: the pipeline stopped: {status.state}")
                await asyncio.sleep(0.1)
            outcomes = await writing
            lake_rows = await asyncio.to_thread(
                read_snapshot, await catalog.table_files(namespace, "accounts")
            )
            source_rows = [dict(row) for row in await self.pool.fetch(bank["accounts"])]
            committed = sum(done for done, _ in outcomes)
            rolled_back = sum(undone for _, undone in outcomes)
            seen = sorted(set(totals.values()))
            self.say(
                f"   {committed} transfers committed by {DEMO_WRITERS} writers, {rolled_back} "
                "rolled back (never published)"
            )
            self.say(
                f"   a lake reader read {len(totals)} snapshots while they were applied: every "
                f"one totals {', '.join(map(str, seen))} (the source's total is {total})"
            )
            self.say(
                f"   pipeline status: position {status.position}, {status.batches_applied} "
                f"batches and {status.transactions_applied} transactions applied, lag "
                f"{status.lag_transactions}"
            )
            equal = lake_rows == source_rows
            self.say(
                f"   the lake table equals the source row for row ({len(lake_rows)} rows): "
                f"{'yes' if equal else 'NO'}"
            )
            if seen != [total] or not equal:
                raise ProcbusError("demo: the lake table did not keep the bank's total")
            return DemoPipeline(
                source_table=capture.source,
                lake_table=lake_table,
                topic=topic,
                snapshot_rows=capture.snapshot_rows,
                transfers_committed=committed,
                transfers_rolled_back=rolled_back,
                lake_snapshots_read=len(totals),
                lake_totals_seen=seen,
                expected_total=total,
                batches_applied=status.batches_applied,
                transactions_applied=status.transactions_applied,
                lake_equals_source=equal,
            )
        finally:
            with contextlib.suppress(ProcbusError):
                await captures.delete(source, topic)
            await topics.delete(topic, force=True)
            await self.pool.execute(bank["drop_accounts"])

    async def residue(self, namespace: str, table: str, procedure_id: str) -> list[str]:
        catalog = Catalog(self.pool)
        found = []
        if await catalog.get_table(namespace, table) is not None:
            found.append("catalog row")
        if warehouse.table_folder(self.settings.warehouse_root, namespace, table).exists():
            found.append("warehouse folder")
        if any(event["procedure_id"] == procedure_id for event in await catalog.list_events()):
            found.append("event")
        return found

    async def own_procedure(self) -> DemoOwnProcedure:
        """A user's own procedure (examples/user_procedures.py) on a user's own worker: Temporal's
        Worker with procbus's plugin, as `procbus worker --workflows` runs it too."""
        module = USER_PROCEDURES
        self.say(f"13. Your own procedure: RefreshCaches from {module} on a worker of your own")
        try:
            user = load_user_procedures([module], WORKFLOWS)
        except ConfigError as error:
            raise ProcbusError(
                f"demo: the own-procedure scene runs {module} from procbus's project folder; run "
                f"the demo there, as `make demo` does ({error})"
            ) from None
        task_queue = f"demo-own-{self.run_id}"
        settings = self.settings.model_copy(update={"worker_id": f"demo-{self.run_id}-own"})
        plugin = ProcbusPlugin(settings, pool=self.pool, auth=self.auth, outbox_relay=False)
        notes = self.settings.state_dir.resolve() / f"demo-notes-{self.run_id}"
        orders = self.settings.state_dir.resolve() / f"demo-orders-{self.run_id}.csv"
        await asyncio.to_thread(
            orders.write_text, "id,amount\n" + "".join(f"{n},{n % 7}\n" for n in range(500))
        )
        procedure_id, refused_id = f"demo-refresh-{self.run_id}", f"demo-refused-{self.run_id}"
        async with Worker(
            self.client,
            task_queue=task_queue,
            workflows=user.workflows,
            activities=user.activities,
            plugins=[plugin],
        ):
            async with asyncio.timeout(60):
                await plugin.ready.wait()
                # JSON in, as the `temporal` CLI would send it.
                done = await self.client.execute_workflow(
                    "RefreshCaches",
                    {"table": "orders", "notes": str(notes), "count_rows_of": str(orders)},
                    id=procedure_id,
                    task_queue=task_queue,
                )
                with expected_activity_failures():
                    try:
                        await self.client.execute_workflow(
                            "RefreshCaches",
                            {"table": "customers", "notes": str(notes), "refuse": True},
                            id=refused_id,
                            task_queue=task_queue,
                        )
                        raise ProcbusError("demo: a refused RefreshCaches succeeded")
                    except WorkflowFailureError:
                        pass
                # Queries: answered while the worker that runs the procedure is up.
                status = await procedure_status(self.client, procedure_id)
                refused = await procedure_status(self.client, refused_id)
        kept = await asyncio.to_thread(notes.read_text)
        notes_left = [line.split(" ", 1)[1] for line in kept.splitlines()]
        self.say(
            f"   {procedure_id}: {status.state.value}, a lock, a step, a Spark job step that "
            f"counted {done['rows']} rows, and a broadcast that reached {len(done['members'])} "
            "workers"
        )
        self.say(
            f"   {refused_id}: {refused.state.value}, its note undone (notes kept: {notes_left})"
        )
        if status.state is not ProcedureState.SUCCEEDED or notes_left != ["orders"]:
            raise ProcbusError(f"demo: the user's procedure ended {status.state}, {notes_left}")
        return DemoOwnProcedure(
            module=module,
            task_queue=task_queue,
            procedure_id=procedure_id,
            state=status.state,
            broadcast_reached=done["members"],
            refused_id=refused_id,
            refused_state=refused.state,
            notes_after_rollback=notes_left,
            rows_counted=done["rows"],
        )


class _ChangedItsMind(Exception):
    """A demo transfer the application rolls back."""


async def demo_transfers(pool: asyncpg.Pool, seed: int) -> tuple[int, int]:
    """Transfers between the demo's accounts, one in five rolled back: (committed, rolled back)."""
    bank = load_queries("procbus.starter")
    rng = random.Random(seed)
    committed = rolled_back = 0
    async with pool.acquire() as connection:
        for _ in range(DEMO_TRANSFERS_EACH):
            payer, payee = rng.sample(range(1, DEMO_ACCOUNTS + 1), 2)
            amount = rng.randint(1, 100)
            with contextlib.suppress(_ChangedItsMind):
                async with connection.transaction():
                    await connection.execute(bank["lock_accounts"], [payer, payee])
                    await connection.execute(bank["move_money"], payer, -amount)
                    await connection.execute(bank["move_money"], payee, amount)
                    if rng.random() < 0.2:
                        rolled_back += 1
                        raise _ChangedItsMind
                    committed += 1
            await asyncio.sleep(0.01)
    return committed, rolled_back


async def run_demo(
    settings: Settings, *, quiet: bool = False, only: list[str] | None = None
) -> DemoReport:
    """The main job end to end (or the scenes named in `only`, with what they need)."""
    steps = demo_steps(only)  # refused before anything starts
    if not quiet:
        console.print("procbus demo", style="bold")
    async with _stack(settings) as (services, started):
        dev_worker_auth(settings)  # the key the client signs with exists from here on
        client = await connect_client(
            services.temporal_address,
            services.namespace,
            settings,
            signer=client_signer(settings),
        )
        pool = await create_pool(services.database_url)
        demo = Demo(settings, services, client, pool, quiet)
        demo.say(
            f"stack: {'started an embedded one' if started else 'using the running one'}"
            f" (Temporal {services.temporal_address})"
        )
        try:
            # Our own worker too: the demo works whether or not another one is running.
            async with contextlib.AsyncExitStack() as workers:
                # Member 1 and the demo's worker are one process: its table activities enforce
                # member 1's ACL cache.
                caches = [AccessCache() for _ in range(3)]
                await workers.enter_async_context(
                    build_worker(
                        client,
                        pool,
                        services.task_queue,
                        warehouse_root=settings.warehouse_root,
                        access=caches[0],
                        auth=demo.auth,
                        spark_master=settings.spark_master,
                        # The demo watches its short Spark jobs closely.
                        spark_progress_seconds=0.2,
                        heartbeat_throttle=timedelta(seconds=0.2),
                    )
                )
                for number, acl in enumerate(caches, start=1):  # as three worker processes
                    member = await workers.enter_async_context(
                        bus_member(
                            client,
                            pool,
                            services.task_queue,
                            tables=DescriptorCache(),
                            access=acl,
                            member_id=f"demo-{demo.run_id}-{number}",
                        )
                    )
                    demo.members.append(member)
                check_id, check = await demo.stack_check()
                report = DemoReport(
                    started_stack=started,
                    temporal_address=services.temporal_address,
                    ui_url=services.ui_url,
                    steps=steps,
                    stack_check_workflow_id=check_id,
                    stack_check_url=demo.url(check_id),
                    stack_check=check,
                    metrics_url=services.metrics_url,
                )
                namespace = f"demo_{demo.run_id}"
                if "create-table" in steps:
                    report.create_table = await demo.create_table(namespace)
                if "failed-create-table" in steps:
                    failed = await demo.failed_create_table(namespace)
                    report.failed_create_table, report.residue_after_rollback = failed
                if "hooks" in steps:
                    report.hooks = await demo.hooks()
                if "locks" in steps:
                    report.locks = await demo.locks()
                if "bad-input" in steps:
                    report.bad_input = await demo.bad_input()
                if "topics" in steps:
                    report.topics = await demo.topics()
                if "grouped" in steps:
                    report.grouped = await demo.grouped_batches()
                if "kafka" in steps:
                    report.kafka = await demo.kafka()
                if "bus" in steps:
                    report.access = await demo.access(namespace)
                if "table-data" in steps:
                    report.table_data = await demo.table_data(namespace)
                if "pipeline" in steps:
                    report.pipeline = await demo.pipeline(namespace)
                if "own-procedure" in steps:
                    report.own_procedure = await demo.own_procedure()
        finally:
            await pool.close()
    later = " (after `procbus dev` starts the stack again)" if started and services.ui_url else ""
    if services.ui_url:
        demo.say(f"In the Temporal UI{later}:")
        shown: list[str | None] = [
            check_id,
            report.create_table.procedure_id if report.create_table else None,
            report.failed_create_table.procedure_id if report.failed_create_table else None,
            report.hooks.committed_workflow_id if report.hooks else None,
            report.locks.delete_namespace_id if report.locks else None,
            report.access.revoke_id if report.access else None,
            report.table_data.compaction_id if report.table_data else None,
            report.own_procedure.refused_id if report.own_procedure else None,
        ]
        for workflow_id in filter(None, shown):
            demo.say(f"   {demo.url(workflow_id)}")
    if services.metrics_url:
        demo.say(f"Prometheus metrics of the worker: {services.metrics_url}")
    finished = styled("demo finished: every step worked", "bold green")
    demo.say(
        finished
        if steps == list(DEMO_STEPS)
        else Text.assemble(finished, f" (of {', '.join(steps)})")
    )
    return report

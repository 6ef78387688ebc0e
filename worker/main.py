"""The procbus worker: every workflow and activity, the outbox relay and the sweep Schedule.

`procbus worker` (against the configured services) and `procbus dev` (against the embedded
stack) both run `serve`, so they do the same things.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from activities.auth import AuthActivities
from activities.bus import BusActivities, MemberActivities
from activities.locks import LockActivities
from activities.outbox import OutboxActivities
from activities.procedures import ProcedureActivities
from activities.retention import RetentionActivities
from activities.spark import INCOMING, SparkActivities
from activities.stack_check import StackCheckActivities
from activities.tables import TableActivities
from activities.topics import TopicActivities
from procbus.auth.keys import DEV_PRINCIPAL, ensure_dev_key
from procbus.auth.policy import WorkerAuth
from procbus.bus.member import BusMember
from procbus.bus.membership import (
    MemberLease,
    Membership,
    default_member_id,
    member_task_queue,
)
from procbus.config import Settings
from procbus.core.endpoints import parse_allowlist
from procbus.core.faults import Fault, parse_faults
from procbus.core.metrics import OutboxMetrics
from procbus.db import create_pool
from procbus.delivery.owner import keep_owners
from procbus.engine.runner import workflow_runner
from procbus.errors import MemberNotCurrent
from procbus.hooks.outbox import OutboxRelay, ensure_sweep_schedule
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.lakehouse.catalog import Catalog
from procbus.retention.models import RetentionRequest
from procbus.retention.schedule import ensure_retention_schedule
from procbus.spark.backends import SparkBackend
from procbus.stack.addresses import ServiceAddresses, resolve_addresses
from procbus.temporal.client import connect_client, procbus_runtime
from procbus.temporal.errors import ProcbusErrorInterceptor
from procbus.temporal.faults import FaultInterceptor
from procbus.topics.queue import Topics
from workflows.access import ChangeAccess
from workflows.bus import Broadcast
from workflows.data import CompactTable, LoadTable
from workflows.outbox import OutboxSweep
from workflows.retention import Retention
from workflows.stack_check import StackCheck
from workflows.tables import CreateNamespace, CreateTable, DeleteNamespace, DeleteTable
from workflows.topics import TopicDelivery

HEARTBEAT_THROTTLE = timedelta(seconds=1)

WORKFLOWS: Sequence[type] = (
    StackCheck,
    CreateNamespace,
    DeleteNamespace,
    CreateTable,
    DeleteTable,
    OutboxSweep,
    Retention,
    TopicDelivery,
    Broadcast,
    ChangeAccess,
    LoadTable,
    CompactTable,
)


def activities_for(
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse_root: Path,
    endpoint_allowlist: list[str],
    events_topic: str | None,
    access: AccessCache | None,
    spark: SparkActivities,
    outbox_workflow_types: frozenset[str] | None = None,
    auth: WorkerAuth | None = None,
) -> list[Callable[..., object]]:
    return [
        *AuthActivities(auth or WorkerAuth(), pool).all(),
        StackCheckActivities(pool).record_stack_check,
        OutboxActivities(pool, task_queue, outbox_workflow_types).sweep_outbox,
        *TableActivities(pool, warehouse_root, events_topic, access, auth).all(),
        *LockActivities(pool).all(),
        *ProcedureActivities().all(),
        *TopicActivities(pool, endpoint_allowlist, spark.local_backend).all(),
        *BusActivities(Membership(pool)).all(),
        *RetentionActivities(pool, warehouse_root).all(),
        *spark.all(),
    ]


def worker_interceptors(faults: Sequence[Fault] = ()) -> list[Interceptor]:
    # The first is the outermost: procbus errors become typed ApplicationErrors last.
    interceptors: list[Interceptor] = [ProcbusErrorInterceptor()]
    if faults:
        interceptors.append(FaultInterceptor(list(faults)))
    return interceptors


def build_worker(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    *,
    warehouse_root: Path,
    faults: Sequence[Fault] = (),
    endpoint_allowlist: list[str] | None = None,
    events_topic: str | None = None,
    access: AccessCache | None = None,
    spark_master: str = "local[*]",
    spark_progress_seconds: float = 2.0,
    spark_backend: SparkBackend | None = None,
    spark_rest_url: str | None = None,
    spark_web_url: str | None = None,
    worker_id: str | None = None,
    heartbeat_throttle: timedelta = HEARTBEAT_THROTTLE,
    outbox_workflow_types: frozenset[str] | None = None,
    load_roots: Sequence[Path] | None = None,
    auth: WorkerAuth | None = None,
    workflows: Sequence[type] = WORKFLOWS,
) -> Worker:
    """A worker with every procbus workflow (only `workflows` when given: each costs a sandbox
    check when the worker is built) and activity, its activities on `pool`; its table
    activities check principals against `access`, the ACL cache of this process's bus member.
    `auth` says which principal tokens it trusts and who runs unauthenticated starts (none
    unless given: the production default). Spark starts on `spark_master` when the first Spark
    job runs; loads read only under `load_roots` (unset: the warehouse's incoming/ folder)."""
    auth = auth or WorkerAuth()
    # incoming/ made at once: where to put a load's input is plain to see.
    (warehouse_root / INCOMING).mkdir(parents=True, exist_ok=True)
    spark = SparkActivities(
        pool,
        warehouse_root,
        spark_master,
        worker_id=worker_id,
        progress_every_seconds=spark_progress_seconds,
        backend=spark_backend,
        spark_rest_url=spark_rest_url,
        spark_web_url=spark_web_url,
        load_roots=load_roots,
        access=access,
        auth=auth,
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        workflow_runner=workflow_runner(),
        activities=activities_for(
            pool,
            task_queue,
            warehouse_root,
            endpoint_allowlist or [],
            events_topic,
            access,
            spark,
            outbox_workflow_types,
            auth,
        ),
        interceptors=worker_interceptors(faults),
        # A running job's progress reaches the UI every few seconds, not every 0.8 x timeout.
        max_heartbeat_throttle_interval=heartbeat_throttle,
    )


@contextlib.asynccontextmanager
async def bus_member(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    *,
    tables: DescriptorCache,
    access: AccessCache,
    member_id: str | None = None,
    timeout_seconds: float = 15.0,
    faults: Sequence[Fault] = (),
) -> AsyncIterator[BusMember]:
    """This process as a bus member while inside: joined (heartbeating), its caches rebuilt
    from the catalog, and a worker on its own task queue applying what the bus sends. After a
    lapsed heartbeat it rebuilds them again before serving; `member.taken_over` is set when
    another process joins under the same ID (this one then refuses to serve)."""
    member_id = member_id or default_member_id()
    queue = member_task_queue(task_queue, member_id)
    lease = MemberLease(timeout_seconds)
    member = BusMember(member_id, tables, access, lease)
    catalog = Catalog(pool)
    # After joining: a change the bus decides from now on reaches this member by message,
    # one decided before is in the catalog read after the first heartbeat.
    async with Membership(pool).joined(
        member_id, queue, lease, lambda: member.refresh(catalog)
    ) as started_at:
        member.started_at = started_at
        async with Worker(
            client,
            task_queue=queue,
            activities=MemberActivities(member).all(),
            interceptors=worker_interceptors(faults),
        ):
            yield member


async def serve(
    settings: Settings,
    services: ServiceAddresses,
    stop: asyncio.Event,
    on_ready: Callable[[], None] | None = None,
    *,
    metrics_address: str | None = None,
    auth: WorkerAuth | None = None,
) -> None:
    """Run a worker on `services` until `stop` is set: the workflows and activities, the
    outbox relay loop, the Temporal Schedules that sweep what a dead relay left and delete what is
    past its retention, and a delivery
    workflow for every topic; with
    `metrics_address`, Prometheus metrics there (the SDK's and procbus's). `auth` defaults to
    the settings' (a production worker: unauthenticated starts refused unless they say)."""
    client = await connect_client(
        services.temporal_address, services.namespace, settings, metrics_address=metrics_address
    )
    metrics = None
    if metrics_address is not None:
        metrics = OutboxMetrics(procbus_runtime(metrics_address).metric_meter)
    pool = await create_pool(services.database_url)
    allowlist = parse_allowlist(settings.endpoint_allowlist)
    faults = parse_faults(settings.faults)
    # Until the bus member has read the catalog, ACL checks are refused (and retried).
    tables, access = DescriptorCache(), AccessCache(guard=_not_joined_yet)
    member: BusMember | None = None
    try:
        async with (
            build_worker(
                client,
                pool,
                services.task_queue,
                warehouse_root=settings.warehouse_root,
                faults=faults,
                access=access,
                endpoint_allowlist=allowlist,
                events_topic=settings.events_topic,
                spark_master=settings.spark_master,
                spark_rest_url=settings.spark_rest_url,
                spark_web_url=settings.spark_web_url,
                worker_id=settings.worker_id,
                outbox_workflow_types=settings.allowed_outbox_workflow_types(),
                load_roots=settings.load_root_paths,
                auth=auth or worker_auth(settings),
            ),
            bus_member(
                client,
                pool,
                services.task_queue,
                tables=tables,
                access=access,
                member_id=settings.worker_id,
                timeout_seconds=settings.member_timeout_seconds,
                faults=faults,
            ) as member,
        ):
            await ensure_sweep_schedule(client, services.task_queue)
            await ensure_retention_schedule(
                client,
                services.task_queue,
                retention_request(settings),
                timedelta(seconds=settings.retention_every_seconds),
            )
            if on_ready is not None:
                on_ready()
            await asyncio.gather(
                # Performs durable calls whose process died between commit and relay.
                OutboxRelay(
                    client,
                    pool,
                    services.task_queue,
                    metrics,
                    allowed_workflow_types=settings.allowed_outbox_workflow_types(),
                ).run(stop),
                # Every topic gets its one delivery workflow.
                keep_owners(client, Topics(pool).list_topics, services.task_queue, stop),
                stop_when_taken_over(member, stop),
            )
    finally:
        await pool.close()
    if member is not None and member.taken_over.is_set():
        member.check_current()  # raises: says which process took the worker ID over


def worker_auth(settings: Settings) -> WorkerAuth:
    """A production worker's trust: only what the settings say."""
    return WorkerAuth(
        key=settings.auth_key_bytes,
        unauthenticated_principal=settings.unauthenticated_principal,
        operator_principal=settings.operator_principal,
    )


def dev_worker_auth(settings: Settings) -> WorkerAuth:
    """The dev stack's: its own key, and unauthenticated starts run as the dev operator unless
    the settings say otherwise."""
    return WorkerAuth(
        key=settings.auth_key_bytes or ensure_dev_key(settings.state_dir),
        unauthenticated_principal=settings.unauthenticated_principal or DEV_PRINCIPAL,
        operator_principal=settings.operator_principal or DEV_PRINCIPAL,
    )


def retention_request(settings: Settings) -> RetentionRequest:
    """The Retention input the settings ask for (PROCBUS_*_RETENTION_SECONDS)."""
    return RetentionRequest(
        outbox_seconds=settings.outbox_retention_seconds,
        spark_job_seconds=settings.spark_job_retention_seconds,
        snapshot_seconds=settings.snapshot_retention_seconds,
        batch_fence_seconds=settings.batch_fence_retention_seconds,
        bus_member_seconds=settings.bus_member_retention_seconds,
    )


def _not_joined_yet() -> None:
    raise MemberNotCurrent("this worker has not joined the bus yet: its ACL cache is not read")


async def stop_when_taken_over(member: BusMember, stop: asyncio.Event) -> None:
    """Sets `stop` once another process joined under this one's worker ID: two processes must
    never serve as one member (the other gets its messages, this one would miss them)."""
    waits = [asyncio.ensure_future(member.taken_over.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if member.taken_over.is_set():
        stop.set()


@contextlib.contextmanager
def stopped_by_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop`: the worker finishes its tasks and leaves cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """`procbus worker`: serve the configured services until SIGINT/SIGTERM (or `stop`)."""
    stop = stop or asyncio.Event()
    with stopped_by_signals(stop):
        await serve(
            settings, resolve_addresses(settings), stop, metrics_address=settings.metrics_address()
        )

"""The procbus worker: every built-in workflow and activity on procbus's plugin (which brings the
engine's activities, the bus membership and the outbox relay), and the sweep Schedule.

`procbus worker` (against the configured services) and `procbus dev` (against the embedded
stack) both run `serve`, so they do the same things.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.activities import (
    INCOMING,
    OutboxActivities,
    RetentionActivities,
    SparkActivities,
    StackCheckActivities,
    TableActivities,
    TopicActivities,
)
from procbus.auth import WorkerAuth
from procbus.bus import BusMember, default_member_id, member_task_queue
from procbus.config import Settings
from procbus.core import (
    Fault,
    KafkaCredentials,
    OutboxMetrics,
    parse_allowlist,
    stuck_procedures_gauge,
)
from procbus.db import create_pool
from procbus.db.pool import until_reachable
from procbus.delivery import DELIVERY_POLL_MAX_SECONDS, keep_owners
from procbus.hooks import ensure_sweep_schedule
from procbus.lakehouse import DescriptorCache
from procbus.lakehouse.cache import AccessCache
from procbus.plugin import (
    ProcbusPlugin,
    dev_worker_auth,
    stop_when_taken_over,
    worker_auth,
    worker_interceptors,
)
from procbus.plugin import bus_member as joined_bus
from procbus.procedures import report_stuck
from procbus.retention import RetentionRequest, ensure_retention_schedule
from procbus.spark import SparkBackend
from procbus.stack import ServiceAddresses, resolve_addresses
from procbus.temporal import connect_client, procbus_runtime
from procbus.topics import Topics
from procbus.worker.extensions import UserProcedures
from procbus.workflows import (
    Broadcast,
    ChangeAccess,
    CompactTable,
    CreateNamespace,
    CreateTable,
    DeleteNamespace,
    DeleteTable,
    LoadTable,
    OutboxSweep,
    Retention,
    StackCheck,
    TopicDelivery,
)

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
    kafka_credentials: Mapping[str, KafkaCredentials] | None = None,
    delivery_poll_max_seconds: float = DELIVERY_POLL_MAX_SECONDS,
    retention_floors: RetentionRequest | None = None,
) -> list[Callable[..., object]]:
    """The built-in procedures' activities (the engine's own come with the plugin)."""
    return [
        StackCheckActivities(pool).record_stack_check,
        OutboxActivities(pool, task_queue, outbox_workflow_types).sweep_outbox,
        *TableActivities(pool, warehouse_root, events_topic, access, auth).all(),
        *TopicActivities(
            pool, endpoint_allowlist, kafka_credentials, delivery_poll_max_seconds
        ).all(),
        *RetentionActivities(pool, warehouse_root, retention_floors).all(),
        *spark.all(),
    ]


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
    plugin: ProcbusPlugin | None = None,
    user_activities: Sequence[Callable[..., object]] = (),
) -> Worker:
    """Build a worker with every procbus workflow and activity, its activities on `pool`.

    Only `workflows` when given: each costs a sandbox check when the worker is built. Its table
    activities check principals against `access`, the ACL cache of this process's bus member.
    `auth` says which principal tokens it trusts and who runs unauthenticated starts (none
    unless given: the production default). Spark starts on `spark_master` when the first Spark
    job runs; loads read only under `load_roots` (unset: the warehouse's incoming/ folder).
    The engine's interceptors, runner and activities come from `plugin` (`serve`'s runs the bus
    member and the outbox relay too), else from a plugin that runs neither and stops at once
    (no graceful shutdown timeout); `user_activities` are those of users' procedures among
    `workflows`.
    """
    auth = auth or WorkerAuth()
    plugin = plugin or ProcbusPlugin(
        Settings(worker_shutdown_seconds=0),
        pool=pool,
        auth=auth,
        bus_member=False,
        outbox_relay=False,
        faults=faults,
    )
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
            plugin.settings.kafka_credentials,
            plugin.settings.delivery_poll_max_seconds,
            retention_request(plugin.settings),
        )
        + list(user_activities),
        plugins=[plugin],
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
    """This process as a bus member of the worker on `task_queue` while inside, outside any
    plugin (tests, benchmarks, the demo's in-process worker); see procbus.plugin.member."""
    member_id = member_id or default_member_id()
    async with joined_bus(
        client,
        pool,
        member_task_queue(task_queue, member_id),
        tables=tables,
        access=access,
        member_id=member_id,
        timeout_seconds=timeout_seconds,
        interceptors=worker_interceptors(faults),
    ) as member:
        yield member


async def serve(
    settings: Settings,
    services: ServiceAddresses,
    stop: asyncio.Event,
    on_ready: Callable[[], None] | None = None,
    *,
    metrics_address: str | None = None,
    auth: WorkerAuth | None = None,
    user: UserProcedures | None = None,
) -> None:
    """Run a worker on `services` until `stop` is set: the workflows and activities, and through
    procbus's plugin the bus membership and the outbox relay loop; the Temporal Schedules that
    sweep what a dead relay left and delete what is past its retention, and a delivery workflow
    for every topic; with `metrics_address`, Prometheus metrics there (the SDK's and procbus's).
    `auth` defaults to the settings' (a production worker: unauthenticated starts refused
    unless they say). `user` adds users' procedures and their activities."""
    client = await connect_client(
        services.temporal_address,
        services.namespace,
        settings,
        metrics_address=metrics_address,
        options=services.temporal_options,
    )
    metrics = stuck = None
    if metrics_address is not None:
        meter = procbus_runtime(metrics_address).metric_meter
        metrics, stuck = OutboxMetrics(meter), stuck_procedures_gauge(meter)
    # Started while PostgreSQL is down or restarting: it waits, saying so, rather than exit.
    pool = await until_reachable(lambda: create_pool(services.database_url), "worker starting")
    auth = auth or worker_auth(settings)
    plugin = ProcbusPlugin(settings, pool=pool, auth=auth, outbox_metrics=metrics)
    member: BusMember | None = None
    try:
        async with build_worker(
            client,
            pool,
            services.task_queue,
            warehouse_root=settings.warehouse_root,
            faults=plugin.faults,
            access=plugin.access,
            endpoint_allowlist=parse_allowlist(settings.endpoint_allowlist),
            events_topic=settings.events_topic,
            spark_master=settings.spark_master,
            spark_rest_url=settings.spark_rest_url,
            spark_web_url=settings.spark_web_url,
            worker_id=settings.worker_id,
            outbox_workflow_types=settings.allowed_outbox_workflow_types(),
            load_roots=settings.load_root_paths,
            auth=auth,
            plugin=plugin,
            workflows=[*WORKFLOWS, *(user.workflows if user else [])],
            user_activities=user.activities if user else (),
        ):
            # The worker runs the plugin's services in its own task: ready once they are.
            await plugin.ready.wait()
            member = plugin.member
            assert member is not None
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
                # Every topic gets its one delivery workflow.
                keep_owners(client, Topics(pool).list_topics, services.task_queue, stop),
                stop_when_taken_over(member, stop),
                # With metrics served: the namespace's STUCK procedures, counted every 30 s.
                *([report_stuck(client, stuck, stop)] if stuck is not None else []),
            )
    finally:
        await pool.close()
    if member is not None and member.taken_over.is_set():
        member.check_current()  # raises: says which process took the worker ID over


def retention_request(settings: Settings) -> RetentionRequest:
    """The Retention input the settings ask for (PROCBUS_*_RETENTION_SECONDS)."""
    return RetentionRequest(
        outbox_seconds=settings.outbox_retention_seconds,
        spark_job_seconds=settings.spark_job_retention_seconds,
        snapshot_seconds=settings.snapshot_retention_seconds,
        orphan_seconds=settings.orphan_file_retention_seconds,
        batch_fence_seconds=settings.batch_fence_retention_seconds,
        bus_member_seconds=settings.bus_member_retention_seconds,
    )


@contextlib.contextmanager
def stopped_by_signals(stop: asyncio.Event) -> Iterator[None]:
    """Set `stop` on SIGINT and SIGTERM while inside: the worker finishes its tasks and leaves."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


async def run_worker(
    settings: Settings, stop: asyncio.Event | None = None, user: UserProcedures | None = None
) -> None:
    """Run `procbus worker`: serve the configured services until SIGINT/SIGTERM (or `stop`).

    Args:
        settings: the worker's settings (PROCBUS_*).
        stop: set it to stop the worker as the signals do.
        user: users' procedures, served beside the built-in ones.
    """
    stop = stop or asyncio.Event()
    with stopped_by_signals(stop):
        await serve(
            settings,
            resolve_addresses(settings),
            stop,
            metrics_address=settings.metrics_address(),
            user=user,
        )


__all__ = [
    "WORKFLOWS",
    "build_worker",
    "bus_member",
    "dev_worker_auth",
    "run_worker",
    "serve",
    "stopped_by_signals",
    "worker_auth",
    "worker_interceptors",
]

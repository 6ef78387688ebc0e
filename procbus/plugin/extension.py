"""`ProcbusPlugin`: what a worker needs to run procedures, as one Temporal plugin.

    client = await Client.connect(address, plugins=[ProcbusPlugin(settings)])
    worker = Worker(client, task_queue="my-queue", workflows=[MyProcedure], activities=[...])

It adapts what the user set rather than replacing it, as Temporal's contrib plugins do. On a
client it puts procbus's payload converter (pydantic models as JSON, so the `temporal` CLI can
start procedures) into the client's data converter, whose payload codec and failure converter
stay; on every worker built from that client (or given the plugin itself) it appends the error
and fault interceptors to the worker's, adds procbus's passthrough modules to the worker's
sandbox restrictions, adds the engine's own activities (principal checks, locks, a child's
undo stack, the bus's member list) and sets a graceful shutdown timeout
(PROCBUS_WORKER_SHUTDOWN_SECONDS, unless the worker sets one). A worker on a namespace without
procbus's search attributes refuses to start. While its workers run it keeps a PostgreSQL pool,
the process's bus membership, the outbox relay and (from the first `spark_job` step on) a Spark
session going: started with the first worker that runs, shared by the others, stopped with the
last (the member's queue and the relay's default task queue are the first worker's).
`bus_member=False` and `outbox_relay=False` leave those out for a worker that runs no
broadcasting procedure or shares its task queue with one that relays. procbus's own worker
(worker/main.py) is built on the same plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import timedelta

import asyncpg
from opentelemetry.trace import TracerProvider
from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.worker import Interceptor, Worker, WorkerConfig

from procbus.auth import DEV_PRINCIPAL, WorkerAuth, ensure_dev_key
from procbus.bus import BusMember, Membership, default_member_id, member_task_queue
from procbus.config import Settings
from procbus.core import (
    Fault,
    OutboxMetrics,
    mark_never_started,
    parse_faults,
    tracer_configured,
)
from procbus.db.pool import unopened_pool
from procbus.engine import procbus_runner
from procbus.errors import ProcbusError
from procbus.hooks import OutboxRelay
from procbus.lakehouse import DescriptorCache
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.key_index import KEY_INDEX
from procbus.plugin.auth import AuthActivities
from procbus.plugin.bus import BusActivities
from procbus.plugin.locks import LockActivities
from procbus.plugin.member import MemberGuard, bus_member, not_joined_yet
from procbus.plugin.procedures import ProcedureActivities
from procbus.plugin.spark import SparkJobs
from procbus.stack import resolve_database_url, uses_embedded_stack
from procbus.temporal import (
    FaultInterceptor,
    ProcbusErrorInterceptor,
    require_search_attributes,
    with_procbus_payloads,
)
from procbus.temporal.heartbeats import StepHeartbeats

PLUGIN_NAME = "procbus.ProcbusPlugin"


def worker_interceptors(faults: Sequence[Fault] = ()) -> list[Interceptor]:
    # The first is the outermost: procbus errors become typed ApplicationErrors last.
    """Return the interceptors a procbus worker runs, outermost first.

    Args:
        faults: fault rules to inject (drills); none by default.
    """
    interceptors: list[Interceptor] = [ProcbusErrorInterceptor()]
    if faults:
        interceptors.append(FaultInterceptor(list(faults)))
    return interceptors


def worker_auth(settings: Settings) -> WorkerAuth:
    """Return a production worker's trust: only what the settings say."""
    return WorkerAuth(
        key=settings.auth_key_bytes,
        unauthenticated_principal=settings.unauthenticated_principal,
        operator_principal=settings.operator_principal,
        late_seconds=settings.auth_token_late_seconds,
    )


def dev_worker_auth(settings: Settings) -> WorkerAuth:
    """Return the dev stack's worker auth.

    Its own key, and unauthenticated starts run as the dev operator unless the settings say
    otherwise.
    """
    return WorkerAuth(
        key=settings.auth_key_bytes or ensure_dev_key(settings.state_dir),
        unauthenticated_principal=settings.unauthenticated_principal or DEV_PRINCIPAL,
        operator_principal=settings.operator_principal or DEV_PRINCIPAL,
        late_seconds=settings.auth_token_late_seconds,
    )


def tracing_interceptor(provider: TracerProvider | None = None) -> Interceptor:
    """Temporal's tracing interceptor, spans in workflows whoever started them (the `temporal`
    CLI and Schedules start without a client span to hang them on)."""
    from temporalio.contrib.opentelemetry import TracingInterceptor

    tracer = provider.get_tracer("procbus") if provider is not None else None
    return TracingInterceptor(tracer, always_create_workflow_spans=True)


def engine_activities(pool: asyncpg.Pool, auth: WorkerAuth) -> list[Callable[..., object]]:
    """The activities the procedure engine itself runs, whatever the procedure."""
    return [
        *AuthActivities(auth, pool).all(),
        *LockActivities(pool).all(),
        *ProcedureActivities().all(),
        *BusActivities(Membership(pool)).all(),
    ]


@dataclasses.dataclass
class _Services:
    """A plugin's pool, bus member and relay, run for as long as one of its workers runs."""

    task: asyncio.Task[None]
    stop: asyncio.Event
    namespace: str  # the Temporal namespace its member and relay serve
    workers: int = 0  # its workers running now


# The member IDs this process's plugins have joined the bus as.
_JOINED_MEMBERS: set[str] = set()


@contextlib.contextmanager
def _joined_once(member_id: str) -> Iterator[None]:
    # A second member under one ID takes the bus messages of the first: refused before it joins.
    if member_id in _JOINED_MEMBERS:
        raise ProcbusError(
            f"another ProcbusPlugin in this process has joined the bus as {member_id!r}: run "
            "this process's workers with one plugin (they share its pool and bus member), or "
            "give each plugin its own worker ID (ProcbusPlugin(Settings(worker_id=...)))"
        )
    _JOINED_MEMBERS.add(member_id)
    try:
        yield
    finally:
        _JOINED_MEMBERS.discard(member_id)


class ProcbusPlugin(SimplePlugin):
    """procbus on a Temporal client and its workers (see the module's docstring).

    The database comes from `pool` when given (its owner opens and closes it), else from the
    settings (PROCBUS_DATABASE_URL, or the running `procbus dev` stack). `auth` defaults to the
    settings' trust, or the dev stack's own key on an embedded stack. `faults` (default:
    PROCBUS_FAULTS) injects failures for drills. `tracing` (default: PROCBUS_OTEL, or whenever
    an OpenTelemetry tracer provider is configured) adds Temporal's tracing interceptor, on the
    client and the worker, and with it procbus's spans (procbus/engine/tracing.py), through
    `tracer_provider` when given, else the process's."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        auth: WorkerAuth | None = None,
        bus_member: bool = True,
        outbox_relay: bool = True,
        faults: Sequence[Fault] | None = None,
        outbox_metrics: OutboxMetrics | None = None,
        tracing: bool | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.faults = list(parse_faults(self.settings.faults) if faults is None else faults)
        self.runs_bus_member = bus_member
        self.runs_outbox_relay = outbox_relay
        self.outbox_metrics = outbox_metrics
        self._given_pool = pool
        self._pool = pool
        self._auth = auth
        self._database_url: str | None = None
        # The process's caches, kept by its bus member; ACL checks wait until it has joined.
        self.tables = DescriptorCache()
        KEY_INDEX.max_bytes = self.settings.key_index_bytes
        self.access = AccessCache(guard=not_joined_yet)
        self.member: BusMember | None = None
        # Set once the worker's services run (the member joined): it may take work.
        self.ready = asyncio.Event()
        # The Spark session of this worker's `spark_job` steps: started by the first job.
        self.spark_jobs = SparkJobs(
            self.settings.spark_master,
            self.settings.warehouse_root,
            tracer_provider=tracer_provider,
        )
        self._member_queues: set[str] = set()
        self._running: _Services | None = None  # the services its running workers share
        self._checked_namespaces: set[str] = set()  # those with procbus's search attributes
        if tracing is None:
            tracing = tracer_provider is not None or self.settings.otel or tracer_configured()
        self.tracing = tracing
        super().__init__(
            PLUGIN_NAME,
            # Adapted, not replaced: the user's codec, failure converter and sandbox are kept.
            data_converter=with_procbus_payloads,
            interceptors=[
                # Outermost: a step held up inside (an injected delay) heartbeats like a slow one.
                StepHeartbeats(),
                *worker_interceptors(self.faults),
                # Inside the error mapping: its refusal reaches Temporal as MemberNotCurrent.
                MemberGuard(lambda: self.member),
                *([tracing_interceptor(tracer_provider)] if self.tracing else []),
            ],
            workflow_runner=procbus_runner,
        )

    def _resolve(self) -> None:
        if self._database_url is not None:
            return
        self._database_url = resolve_database_url(self.settings)
        if self._auth is None:
            embedded = uses_embedded_stack(self.settings)
            self._auth = (dev_worker_auth if embedded else worker_auth)(self.settings)

    @property
    def auth(self) -> WorkerAuth:
        if self._auth is None:
            self._resolve()
        assert self._auth is not None
        return self._auth

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool the engine's activities use: opened while a worker runs."""
        if self._pool is None:
            self._resolve()
            assert self._database_url is not None
            self._pool = unopened_pool(self._database_url)
        return self._pool

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        if config.get("task_queue") in self._member_queues:
            return config  # the plugin's own bus-member worker: set up by the plugin already
        config = super().configure_worker(config)
        if not config.get("graceful_shutdown_timeout"):  # the SDK's default, 0: set none
            config["graceful_shutdown_timeout"] = timedelta(
                seconds=self.settings.worker_shutdown_seconds
            )
        config["activities"] = [
            *config.get("activities", []),
            *engine_activities(self.pool, self.auth),
        ]
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        if worker.task_queue in self._member_queues:
            await next(worker)
            return
        services = await self._start(worker)
        try:
            # In the worker's own task: its activities see the jobs through a context variable.
            with self.spark_jobs.serving():
                await next(worker)
        finally:
            await self._leave(services)

    async def _start(self, worker: Worker) -> _Services:
        """Join the plugin's services once they run; a worker refused here never starts."""
        try:
            await self._require_search_attributes(worker.client)
            services = await self._join(worker)
        except BaseException:
            mark_never_started(worker)
            raise
        try:
            await self._until_ready(services)
        except BaseException:
            mark_never_started(worker)
            await self._leave(services)
            raise
        return services

    async def _require_search_attributes(self, client: Client) -> None:
        # One list call per namespace: procedures on one without them fail at their first step.
        if client.namespace not in self._checked_namespaces:
            await require_search_attributes(client, client.namespace)
            self._checked_namespaces.add(client.namespace)

    async def _join(self, worker: Worker) -> _Services:
        """The plugin's services, started by its first running worker, shared by the others."""
        while (running := self._running) is not None and running.stop.is_set():
            if running.task.done():
                break
            await asyncio.wait([running.task])  # the last worker's services are still stopping
        if running is None or running.task.done():
            stop = asyncio.Event()
            task = asyncio.create_task(self._serve(worker, stop))
            running = self._running = _Services(task, stop, worker.client.namespace)
        elif running.namespace != worker.client.namespace:
            # The bus member and the relay run in one namespace: the first worker's.
            raise ProcbusError(
                f"this ProcbusPlugin serves workers in Temporal namespace {running.namespace!r}; "
                f"the worker on {worker.task_queue!r} is in {worker.client.namespace!r}: give it "
                "a ProcbusPlugin of its own with its own worker ID "
                "(ProcbusPlugin(Settings(worker_id=...)), or PROCBUS_WORKER_ID)"
            )
        running.workers += 1
        return running

    async def _until_ready(self, services: _Services) -> None:
        ready = asyncio.ensure_future(self.ready.wait())
        try:
            await asyncio.wait([ready, services.task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if services.task.done():  # they did not start: the first worker gets why
            services.task.result()
            raise ProcbusError("the ProcbusPlugin's services stopped before its worker started")

    async def _leave(self, services: _Services) -> None:
        services.workers -= 1
        if services.workers > 0:
            return
        services.stop.set()
        if not self.ready.is_set():
            services.task.cancel()  # its last worker gave up before they were up
        try:
            await asyncio.wait([services.task])
        finally:
            if self._running is services:
                self._running = None
        if not services.task.cancelled():
            services.task.result()

    async def _serve(self, worker: Worker, stop: asyncio.Event) -> None:
        async with self._services(worker, stop):
            await stop.wait()

    @contextlib.asynccontextmanager
    async def _services(self, worker: Worker, stop: asyncio.Event) -> AsyncIterator[None]:
        pool = self.pool
        await pool  # opens its connections (a no-op for a pool already open)
        try:
            async with contextlib.AsyncExitStack() as running:
                if self.runs_bus_member:
                    member_id = self.settings.worker_id or default_member_id()
                    running.enter_context(_joined_once(member_id))
                    queue = member_task_queue(worker.task_queue, member_id)
                    self._member_queues.add(queue)
                    self.member = await running.enter_async_context(
                        bus_member(
                            worker.client,
                            pool,
                            queue,
                            tables=self.tables,
                            access=self.access,
                            member_id=member_id,
                            timeout_seconds=self.settings.member_timeout_seconds,
                            interceptors=worker_interceptors(self.faults),
                        )
                    )
                relay: asyncio.Task[None] | None = None
                if self.runs_outbox_relay:
                    # Performs durable calls whose process died between commit and relay.
                    relay = asyncio.create_task(
                        OutboxRelay(
                            worker.client,
                            pool,
                            worker.task_queue,
                            self.outbox_metrics,
                            allowed_workflow_types=self.settings.allowed_outbox_workflow_types(),
                        ).run(stop)
                    )
                self.ready.set()
                try:
                    yield
                finally:
                    stop.set()
                    if relay is not None:
                        await relay
        finally:
            self.ready.clear()
            if self._given_pool is None:
                await pool.close()
                self._pool = None

"""A nemesis over a test cluster (procbus.testing.cluster): from a seed, a schedule of faults
and a workload of procedures and (on a cluster with a sink) application transactions that
publish to topics, run at once, every event written to a history, and checkers that read the
history, the sink's journal and the cluster's end state (docs/internals/testing.md).

The same seed gives the same schedule of faults and operations; what the cluster does with them
depends on timing, which is the point of running it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import subprocess
import threading
import time
from collections.abc import Callable, Container, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError, RPCStatusCode

from procbus.core.fences import Fence, LockMode
from procbus.core.names import namespace_resource, table_resource
from procbus.db.pool import create_pool
from procbus.db.queries import load_queries
from procbus.errors import ProcbusError
from procbus.hooks import transaction
from procbus.lakehouse.naming import METADATA_FOLDER
from procbus.lakehouse.warehouse import MARKER
from procbus.locks.modes import compatible
from procbus.procedures.client import procedure_status
from procbus.stack.temporal_server import temporal_binary
from procbus.temporal.payloads import procbus_data_converter
from procbus.testing.cluster import Cluster, running_cluster, wait_until

# How long each fault holds before it is healed, in seconds: (shortest, longest).
FAULT_SECONDS = (2.5, 11.0)
FAULT_KINDS = (
    *("kill", "pause", "cut_db", "cut_temporal", "cut_both"),
    *("restart_postgres", "restart_temporal"),
)
SERVER_OF = {"restart_postgres": "db", "restart_temporal": "temporal", "kill_driver": "spark"}
SINK_FAULT_KINDS = ("cut_sink",)  # on a cluster with a sink: a worker cut from the receiver
# On a cluster with latency proxies: a worker's link to PostgreSQL or Temporal slowed, each way
# by a delay in LATENCY_SECONDS (slow rather than dead).
LATENCY_FAULT_KINDS = ("slow_db", "slow_temporal")
LATENCY_SECONDS = (0.05, 1.0)
# On a cluster with a Spark host: every driver running there SIGKILLed (with its Python job).
SPARK_FAULT_KINDS = ("kill_driver",)
NAMESPACES = ("sales", "crm")
TABLES = ("orders", "customers", "events")
PRINCIPALS = ("etl", "analyst")
PERMISSIONS = ("read", "write")
# What the history keeps of each procedure's end (and of one that never ended, what it waited on).
ENDED_KEPT = (
    *("state", "started_at", "closed_at", "failed_step", "stuck_step", "rollback_reason"),
    *("refused", "broadcasts", "error", "last_seen", "pending", "procedure_type", "target"),
)
# A saved history from before "ended" kept a procedure's type: its start's command says it.
_COMMAND_TYPES = {
    ("table", "create"): "CreateTable",
    ("table", "delete"): "DeleteTable",
    ("table", "load"): "LoadTable",
    ("table", "compact"): "CompactTable",
}
# What a procedure may end as after the final heal; STUCK only with its reason.
ENDED = {"SUCCEEDED", "ROLLED_BACK", "STUCK"}
# How often the wait for a procedure's end asks whether it is STUCK (a query to its worker).
STUCK_LOOK_SECONDS = 5.0
# The topics the application transactions publish to: one event at a time, and in batches that
# never split a transaction (the sink's path tells them apart).
HOOKS_TOPIC, GROUPED_TOPIC = "nemesis-hooks", "nemesis-grouped"
TOPIC_PATHS = {HOOKS_TOPIC: "/hooks", GROUPED_TOPIC: "/grouped?batch=1"}
KEYS = ("k0", "k1", "k2", "k3", "k4")
# On a cluster with a Kafka broker on the sink host: a third topic, delivered to the Kafka topic
# KAFKA_TARGET (three partitions, made by `topic create`), read back by a read_committed
# consumer at the end; each record counts as one request of path "/kafka" for the checker.
KAFKA_TOPIC, KAFKA_TARGET = "nemesis-kafka", "nemesis"
# On a cluster with a RabbitMQ broker on the sink host: a fourth topic, delivered to the queue
# AMQP_QUEUE (through the default exchange), read whole at the end; each message counts as one
# request of path "/amqp" for the checker.
AMQP_TOPIC, AMQP_QUEUE = "nemesis-amqp", "nemesis"
# Half the deletions run as this principal (deleting a table's data is writing it): the access
# checker follows its write grants, which the workload's grants and revokes change.
DELETER, DELETER_SHARE = "etl", 0.5
# The user's own procedure (examples/user_procedures.py's RefreshCaches, when the cluster's
# workers run that module), started with the `temporal` CLI as its users do, on the workload's
# tables in `sales`: its X lock contends with theirs. It writes a note in a file of the table's,
# then evicts the table from every worker's cache; one in four then fails, to be undone.
USER_MODULE, USER_PROCEDURE = "examples.user_procedures", "RefreshCaches"
USER_RATE, USER_REFUSE_SHARE = 0.1, 0.25
# Table procedures and grants a second (each started by a `procbus` CLI process).
OPERATIONS_PER_SECOND = 0.7
# On a cluster with a Spark host: loads (of LOAD_ROWS rows from a CSV file of their own) and
# compactions, each a job that runs as a driver on the Spark cluster, at this rate (a driver
# and its executor are two JVMs: seconds of CPU each).
SPARK_OPERATIONS_PER_SECOND, LOAD_ROWS = 1 / 40, 40
# Three in four of them on LAKE_TABLES, made at the start and never deleted (loads and
# compactions contend there: IX against X); the others on the workload's tables, which its
# deletions race.
LAKE_NAMESPACE, LAKE_TABLES, LAKE_SHARE = "lake", ("orders", "events"), 0.75
# And the application's bank: BANK_ACCOUNTS accounts in PostgreSQL, captured into a change
# pipeline that applies their changes to the lake table BANK_TABLE, transfers between them at
# TRANSFERS_PER_SECOND (one in five rolled back), a compaction Schedule on the lake table, and a
# reader of the lake table every LAKE_READ_SECONDS: each snapshot it reads must keep the total.
BANK_SOURCE, BANK_TOPIC, BANK_NAMESPACE, BANK_TABLE = (
    *("nemesis_accounts", "nemesis-bank", "bank", "accounts"),
)
BANK_ACCOUNTS, BANK_OPENING, TRANSFERS_PER_SECOND = 20, 1000, 2.0
BANK_COMPACTION_SCHEDULE, BANK_COMPACTION_EVERY = "nemesis-compact-bank", "90s"
# A run that failed pauses the Schedule (pause on failure): the harness unpauses it, as an
# operator would, when it finds it paused on a look this often.
SCHEDULE_CHECK_SECONDS = 30.0
LAKE_READ_SECONDS = 3.0
# One table procedure in three gets a deadline (`--deadline`), some shorter than a lock wait.
DEADLINE_SHARE, DEADLINES = 1 / 3, (4.0, 8.0, 15.0, 30.0)
# A deadline is a timer in the workflow: under a fault (Temporal restarting, the workflow's
# worker cut off) it is handled late. A procedure that ended later than this past its deadline,
# and never said a word of it, ran past its deadline unnoticed.
DEADLINE_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the run's start
    kind: str
    target: str  # a worker, or "db" for a PostgreSQL restart
    hold: float
    delay: float = 0.0  # a slowed link's, each way


@dataclass(frozen=True)
class Operation:
    at: float
    procedure_id: str
    argv: tuple[str, ...]  # the command that starts it, without its program
    deadline_seconds: float | None = None
    program: str = "procbus"  # or "temporal": the `temporal` CLI


@dataclass(frozen=True)
class AppTransaction:
    """An application transaction: its events (topic, key), committed or rolled back on
    purpose."""

    at: float
    txn: str
    events: tuple[tuple[str, str], ...]
    roll_back: bool


class RolledBackOnPurpose(Exception):
    """Raised inside an application transaction the workload rolls back."""


@dataclass
class History:
    """What happened, in order: each event with its time (seconds from the start)."""

    started: float = field(default_factory=time.monotonic)
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, event: str, **details: Any) -> None:
        at = round(time.monotonic() - self.started, 3)
        with self._lock:
            self.events.append({"t": at, "event": event, **details})

    def of(self, event: str) -> list[dict[str, Any]]:
        return [recorded for recorded in self.events if recorded["event"] == event]

    def write(self, path: Path) -> None:
        path.write_text("".join(json.dumps(event) + "\n" for event in self.events))


def fault_schedule(
    seed: int, seconds: float, workers: list[str], kinds: tuple[str, ...] = FAULT_KINDS
) -> list[Fault]:
    """Faults of `kinds` at random times, one at a time (each healed before the next begins)."""
    rng = random.Random(f"faults-{seed}")
    faults: list[Fault] = []
    at = rng.uniform(2, 5)
    while at < seconds:
        kind = rng.choice(kinds)
        target = SERVER_OF.get(kind) or rng.choice(workers)
        hold = round(rng.uniform(*FAULT_SECONDS), 2)
        delay = round(rng.uniform(*LATENCY_SECONDS), 3) if kind in LATENCY_FAULT_KINDS else 0.0
        faults.append(Fault(round(at, 2), kind, target, hold, delay))
        at += hold + rng.uniform(0.5, 1.5)
    return faults


def _arrivals(rng: random.Random, seconds: float, rate_per_second: float) -> Iterator[float]:
    """Random times within `seconds` (a Poisson process of `rate_per_second`)."""
    at = rng.expovariate(rate_per_second)
    while at < seconds:
        yield at
        at += rng.expovariate(rate_per_second)


def workload(
    seed: int, seconds: float, rate_per_second: float = OPERATIONS_PER_SECOND
) -> list[Operation]:
    """Table procedures and grants on shared tables (their locks contend), at random times;
    some with a deadline, some deletions as `etl` (each from a random generator of its own, so
    a seed's operations and their times stayed what they were before these came)."""
    rng = random.Random(f"workload-{seed}")
    deadline_rng = random.Random(f"deadlines-{seed}")
    principal_rng = random.Random(f"principals-{seed}")
    operations: list[Operation] = []
    for number, at in enumerate(_arrivals(rng, seconds, rate_per_second), start=1):
        table = f"{rng.choice(NAMESPACES)}.{rng.choice(TABLES)}"
        kind = rng.choice(("create", "create", "delete", "grant", "revoke"))
        procedure_id = f"nemesis-{seed}-{number}-{kind}"
        argv: tuple[str, ...]
        if kind == "create":
            argv = ("table", "create", table, "--schema", "id:bigint,note:string")
        elif kind == "delete":
            argv = ("table", "delete", table)
            if principal_rng.random() < DELETER_SHARE:
                argv = (*argv, "--as", DELETER)
        else:
            principal, permission = rng.choice(PRINCIPALS), rng.choice(PERMISSIONS)
            argv = ("acl", kind, principal, table, permission)
        deadline = None
        if deadline_rng.random() < DEADLINE_SHARE:
            deadline = deadline_rng.choice(DEADLINES)
            argv = (*argv, "--deadline", str(deadline))
        argv = (*argv, "--id", procedure_id)
        operations.append(Operation(round(at, 2), procedure_id, argv, deadline))
    return operations


def user_operations(seed: int, seconds: float, notes: Path) -> list[Operation]:
    """The user's procedure at random times (from a generator of its own), each started with
    `temporal workflow start` under an ID of the seed's, its notes in `notes`/notes-TABLE."""
    rng = random.Random(f"user-{seed}")
    operations = []
    for number, at in enumerate(_arrivals(rng, seconds, USER_RATE), start=1):
        table = rng.choice(TABLES)
        request = {
            "table": table,
            "notes": str(notes / f"notes-{table}"),
            "refuse": rng.random() < USER_REFUSE_SHARE,
        }
        procedure_id = f"nemesis-{seed}-u{number}-refresh"
        argv = (
            *("workflow", "start", "--type", USER_PROCEDURE, "--task-queue", "procbus"),
            *("--workflow-id", procedure_id, "--input", json.dumps(request)),
            # Asked again after a lost answer, it must not start a second run of a closed one.
            *("--id-reuse-policy", "RejectDuplicate"),
        )
        operations.append(Operation(round(at, 2), procedure_id, argv, program="temporal"))
    return operations


def spark_operations(seed: int, seconds: float, inputs: Path) -> list[Operation]:
    """Loads and compactions at random times (from a generator of their own), mostly of the
    lake tables, the others of the workload's tables; each load from its own CSV file under
    `inputs`, written when the run sets up."""
    rng = random.Random(f"spark-{seed}")
    operations = []
    for number, at in enumerate(_arrivals(rng, seconds, SPARK_OPERATIONS_PER_SECOND), start=1):
        table = f"{rng.choice(NAMESPACES)}.{rng.choice(TABLES)}"
        if rng.random() < LAKE_SHARE:
            table = f"{LAKE_NAMESPACE}.{rng.choice(LAKE_TABLES)}"
        kind = rng.choice(("load", "load", "compact"))
        procedure_id = f"nemesis-{seed}-s{number}-{kind}"
        argv: tuple[str, ...] = ("table", "compact", table)
        if kind == "load":
            argv = ("table", "load", table, "--from", str(inputs / f"{procedure_id}.csv"))
        operations.append(Operation(round(at, 2), procedure_id, (*argv, "--id", procedure_id)))
    return operations


def write_load_inputs(operations: Sequence[Operation], inputs: Path) -> None:
    """Each load's CSV file: LOAD_ROWS rows of the workload's table schema (id, note)."""
    inputs.mkdir(parents=True, exist_ok=True)
    for number, operation in enumerate(operations):
        if "--from" in operation.argv:
            path = Path(operation.argv[operation.argv.index("--from") + 1])
            first = number * LOAD_ROWS
            rows = (f"{n},{operation.procedure_id}" for n in range(first, first + LOAD_ROWS))
            path.write_text("id,note\n" + "\n".join(rows) + "\n")


def app_transactions(
    seed: int,
    seconds: float,
    rate_per_second: float = 2.0,
    topics: tuple[str, ...] = (HOOKS_TOPIC, GROUPED_TOPIC),
) -> list[AppTransaction]:
    """Application transactions at random times, one after another: each publishes one to four
    events to the two topics, on a few keys; one in five is rolled back."""
    rng = random.Random(f"transactions-{seed}")
    transactions: list[AppTransaction] = []
    for number, at in enumerate(_arrivals(rng, seconds, rate_per_second), start=1):
        events = tuple((rng.choice(topics), rng.choice(KEYS)) for _ in range(rng.randint(1, 4)))
        roll_back = rng.random() < 0.2
        transactions.append(AppTransaction(round(at, 2), f"t{seed}-{number}", events, roll_back))
    return transactions


class Run:
    """One nemesis run on `cluster`: faults and operations from `seed` over `seconds`, and
    application transactions when the cluster has a sink."""

    def __init__(
        self,
        cluster: Cluster,
        seed: int,
        seconds: float,
        procbus: str,
        operations_per_second: float = OPERATIONS_PER_SECOND,
    ) -> None:
        self.cluster = cluster
        self.seed = seed
        self.seconds = seconds
        self.procbus = procbus
        self.history = History()
        # Set when the run is cut short (Ctrl-C): every thread of the workload stops at its
        # next wait, so the cluster comes down at once instead of after the planned minutes.
        self.interrupted = threading.Event()
        self.with_topics = cluster.sink is not None
        kinds: tuple[str, ...] = FAULT_KINDS
        kinds += SINK_FAULT_KINDS if self.with_topics else ()
        kinds += LATENCY_FAULT_KINDS if cluster.latency else ()
        self.with_spark = cluster.spark is not None
        kinds += SPARK_FAULT_KINDS if self.with_spark else ()
        self.faults = fault_schedule(seed, seconds, cluster.worker_names, kinds)
        self.operations = workload(seed, seconds, operations_per_second)
        if USER_MODULE in cluster.worker_modules:
            users = user_operations(seed, seconds, cluster.root)
            self.operations = sorted([*self.operations, *users], key=lambda o: o.at)
        # Load inputs under the workers' default load root.
        self.load_inputs = cluster.warehouse / "incoming"
        if self.with_spark:
            jobs = spark_operations(seed, seconds, self.load_inputs)
            self.operations = sorted([*self.operations, *jobs], key=lambda o: o.at)
        self.topics = [
            *TOPIC_PATHS,
            *([KAFKA_TOPIC] * (cluster.kafka is not None)),
            *([AMQP_TOPIC] * (cluster.amqp is not None)),
        ]
        self.topics = self.topics if self.with_topics else []
        self.transactions = app_transactions(seed, seconds, topics=tuple(self.topics))

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.procbus, *args],
            env=self.cluster.cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def setup(self) -> None:
        # The wall clock at the start: the hosts' logs are stamped with it.
        self.history.record("began", wall=datetime.now(UTC).isoformat(), seed=self.seed)
        asyncio.run(self._sql("install_lock_log"))
        asyncio.run(self._sql("install_catalog_log"))
        for namespace in NAMESPACES:
            created = self.cli("namespace", "create", namespace, "--wait", timeout=120)
            assert created.returncode == 0, created.stderr
        if self.with_topics:
            grouped = ["--group-transactions", "--batch-size", "5"]
            for topic, path in TOPIC_PATHS.items():
                options = grouped if topic == GROUPED_TOPIC else []
                endpoint = self.cluster.sink_url(path)
                created = self.cli("topic", "create", topic, "--endpoint", endpoint, *options)
                assert created.returncode == 0, created.stderr
        if KAFKA_TOPIC in self.topics:
            assert self.cluster.kafka is not None
            brokers = self.cluster.kafka.bootstrap
            endpoint = f"kafka://{brokers}/{KAFKA_TARGET}?create=1&partitions=3"
            created = self.cli("topic", "create", KAFKA_TOPIC, "--endpoint", endpoint)
            assert created.returncode == 0, created.stderr
        if AMQP_TOPIC in self.topics:
            assert self.cluster.amqp is not None
            asyncio.run(_declare_queue(self.cluster.amqp.url, AMQP_QUEUE))
            endpoint = f"{self.cluster.amqp.url}?routing_key={AMQP_QUEUE}"
            created = self.cli("topic", "create", AMQP_TOPIC, "--endpoint", endpoint)
            assert created.returncode == 0, created.stderr
        if self.with_spark:
            self._set_up_the_lake()

    def _set_up_the_lake(self) -> None:
        """The loads' inputs; the bank, its capture into a change pipeline to its lake table,
        and a compaction Schedule on that table. The lake table and the pipeline's grant are
        made by procedures, checked with the workload's (`capture create` would grant the
        pipeline in its own transaction, which tells no worker's cache)."""
        write_load_inputs(self.operations, self.load_inputs)
        asyncio.run(self._sql("install_snapshot_log"))
        asyncio.run(_open_bank(self.cluster.database_url))
        lake_table = f"{BANK_NAMESPACE}.{BANK_TABLE}"
        schema = "id:bigint,owner:string,balance:bigint"
        made = [
            ["table", "create", f"{LAKE_NAMESPACE}.{table}", "--schema", "id:bigint,note:string",
             "--wait", "--id", f"nemesis-{self.seed}-lake-{table}-create"]
            for table in LAKE_TABLES
        ]  # fmt: skip
        for argv in (
            ["namespace", "create", LAKE_NAMESPACE, "--wait"],
            *made,
            ["namespace", "create", BANK_NAMESPACE, "--wait"],
            ["table", "create", lake_table, "--schema", schema, "--wait",
             "--id", f"nemesis-{self.seed}-bank-create"],
            ["acl", "grant", f"pipeline:{BANK_TOPIC}", lake_table, "write", "--wait",
             "--id", f"nemesis-{self.seed}-bank-grant"],
            ["topic", "create", BANK_TOPIC, "--endpoint", f"table://{lake_table}",
             "--group-transactions", "--batch-size", "10"],
            ["capture", "create", BANK_SOURCE, "--topic", BANK_TOPIC],
            ["schedule", "create", BANK_COMPACTION_SCHEDULE, "--procedure", "compact",
             "--table", lake_table, "--every", BANK_COMPACTION_EVERY],
        ):  # fmt: skip
            done = self.cli(*argv, timeout=180)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout}{done.stderr}"
            if "--id" in argv:
                procedure_id = argv[argv.index("--id") + 1]
                self.history.record(
                    "started", procedure_id=procedure_id, argv=argv, deadline_seconds=None
                )

    def run(self) -> None:
        """Operations in one thread, application transactions in another, faults in this one
        (a server restarted from another thread would die with that thread: its parent-death
        signal); then the final heal."""
        operations = threading.Thread(target=self._start_all, name="operations")
        operations.start()
        application = threading.Thread(
            target=lambda: asyncio.run(self._run_transactions()), name="application"
        )
        application.start()
        bank = threading.Thread(target=lambda: asyncio.run(self._run_the_bank()), name="bank")
        schedule = threading.Thread(target=self._keep_the_schedule_running, name="schedule")
        if self.with_spark:
            bank.start()
            schedule.start()
        try:
            self._inject_all()
        except BaseException:
            self.interrupted.set()
            raise
        finally:
            operations.join()
            application.join()
            if self.with_spark:
                bank.join()
                schedule.join()
            self.heal_all()

    def _keep_the_schedule_running(self) -> None:
        """Unpause the compaction Schedule whenever a run that failed paused it (as an operator
        would, `procbus schedule unpause`), every SCHEDULE_CHECK_SECONDS until the run's end."""
        end = self.history.started + self.seconds
        while time.monotonic() + SCHEDULE_CHECK_SECONDS < end:
            if self.interrupted.wait(SCHEDULE_CHECK_SECONDS):
                return
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
                shown = self.cli("schedule", "describe", BANK_COMPACTION_SCHEDULE, "--json")
                described = json.loads(shown.stdout) if shown.returncode == 0 else {}
                if described.get("paused"):
                    unpaused = self.cli("schedule", "unpause", BANK_COMPACTION_SCHEDULE)
                    self.history.record(
                        "schedule_unpaused",
                        note=described.get("note"),
                        done=unpaused.returncode == 0,
                    )

    async def _run_the_bank(self) -> None:
        """Transfers between the bank's accounts, and a reader of the lake table beside them,
        until the run's end."""
        await asyncio.gather(self._transfer(), self._read_the_lake())

    async def _transfer(self) -> None:
        """Each transfer in turn on one connection, one in five rolled back, written to the
        history with its outcome (as the application transactions are)."""
        rng = random.Random(f"bank-{self.seed}")
        queries = load_queries("procbus.testing")
        connection: asyncpg.Connection | None = None
        for number, at in enumerate(_arrivals(rng, self.seconds, TRANSFERS_PER_SECOND), 1):
            payer, payee = sorted(rng.sample(range(1, BANK_ACCOUNTS + 1), 2))  # locks in order
            amount, roll_back = rng.randint(1, 100), rng.random() < 0.2
            if not await asyncio.to_thread(self._sleep_until, at):
                break
            outcome, error, moved = "committed", None, False
            try:
                if connection is None or connection.is_closed():
                    connection = await asyncpg.connect(self.cluster.database_url, timeout=5)
                async with connection.transaction():
                    await connection.execute(queries["move_money"], payer, -amount)
                    await connection.execute(queries["move_money"], payee, amount)
                    moved = True
                    if roll_back:
                        raise RolledBackOnPurpose
            except RolledBackOnPurpose:
                outcome = "rolled_back"
            except Exception as e:
                outcome, error = ("unknown" if moved else "failed"), repr(e)
                if connection is not None:
                    connection.terminate()
                    connection = None
            self.history.record(
                "transfer", number=number, outcome=outcome, **({"error": error} if error else {})
            )
        if connection is not None:
            await connection.close()

    async def _read_the_lake(self) -> None:
        """The lake table's current snapshot read whole every LAKE_READ_SECONDS, as a reader of
        the lake would: its ID and total written to the history (a read that failed, with its
        error: the database restarting, a file compacted away under it)."""
        from procbus.lakehouse.catalog import Catalog
        from procbus.lakehouse.reader import read_snapshot

        end = self.history.started + self.seconds
        while time.monotonic() < end and not self.interrupted.is_set():
            await asyncio.sleep(LAKE_READ_SECONDS)
            try:
                async with asyncio.timeout(30):
                    pool = await create_pool(self.cluster.database_url, min_size=1, max_size=1)
                    try:
                        snapshot = await Catalog(pool).table_files(BANK_NAMESPACE, BANK_TABLE)
                    finally:
                        await pool.close()
                rows = await asyncio.to_thread(read_snapshot, snapshot)
            except Exception as e:
                self.history.record("lake_read_failed", error=repr(e))
                continue
            self.history.record(
                "lake_read",
                snapshot_id=snapshot.snapshot_id,
                rows=len(rows),
                total=sum(row["balance"] for row in rows),
            )

    async def _sql(self, name: str) -> list[dict[str, Any]]:
        """One of the harness's own queries (procbus/testing/queries.sql), its rows as JSON; a
        script of several statements (no rows) goes as one simple query."""
        connection = await asyncpg.connect(self.cluster.database_url, timeout=30)
        query = load_queries("procbus.testing")[name]
        try:
            if name.startswith("install_"):
                await connection.execute(query)
                return []
            rows = await connection.fetch(query)
        finally:
            await connection.close()
        return [
            {k: v.isoformat() if isinstance(v, datetime) else v for k, v in dict(row).items()}
            for row in rows
        ]

    def _start_all(self) -> None:
        for operation in self.operations:
            if not self._sleep_until(operation.at):
                return
            self._start(operation)

    async def _run_transactions(self) -> None:
        """Each application transaction in turn on one connection (so they commit in the
        order they were planned), written to the history with its outcome: committed, rolled
        back (on purpose, or by an error before its commit), or unknown (the commit itself
        failed: PostgreSQL restarting)."""
        connection: asyncpg.Connection | None = None
        for planned in self.transactions:
            if not self._sleep_until(planned.at):
                break
            outcome, error = "committed", None
            published = False
            try:
                if connection is None or connection.is_closed():
                    connection = await asyncpg.connect(self.cluster.database_url, timeout=5)
                async with transaction(connection) as tx:
                    for n, (topic, key) in enumerate(planned.events):
                        await tx.publish(topic, {"txn": planned.txn, "n": n}, key=key)
                    published = True
                    if planned.roll_back:
                        raise RolledBackOnPurpose
            except RolledBackOnPurpose:
                outcome = "rolled_back"
            except Exception as e:  # whatever broke, the outcome is what we know of it
                outcome, error = ("unknown" if published else "failed"), repr(e)
                if connection is not None:
                    connection.terminate()
                    connection = None
            self.history.record(
                "txn",
                txn=planned.txn,
                outcome=outcome,
                events=[list(event) for event in planned.events],
                **({"error": error} if error else {}),
            )
        if connection is not None:
            await connection.close()

    def _sleep_until(self, at: float) -> bool:
        """Wait until `at` seconds into the run; False when the run was cut short meanwhile."""
        left = at - (time.monotonic() - self.history.started)
        return not self.interrupted.wait(max(left, 0))

    def _start(self, operation: Operation) -> None:
        """Start it; a start whose answer was lost (Temporal restarting) is asked again with
        the same ID, which returns the same procedure, until a fault has surely healed."""
        give_up_at = time.monotonic() + FAULT_SECONDS[1] * 3
        details = {
            "procedure_id": operation.procedure_id,
            "argv": list(operation.argv),
            "deadline_seconds": operation.deadline_seconds,
            "program": operation.program,
        }
        while time.monotonic() < give_up_at:
            try:
                if operation.program == "temporal":
                    started = subprocess.run(
                        [str(temporal_binary()), *operation.argv],
                        env=self.cluster.temporal_cli_env(),
                        capture_output=True,
                        text=True,
                        timeout=30,
                    )
                else:
                    started = self.cli(*operation.argv, timeout=30)
            except subprocess.TimeoutExpired:
                continue
            # The `temporal` CLI refuses an ID it already started: an earlier answer was lost.
            if started.returncode == 0 or "already started" in started.stderr.lower():
                self.history.record("started", **details)
                return
            time.sleep(1)
        self.history.record("not_started", **details)

    def _inject_all(self) -> None:
        for fault in self.faults:
            self._sleep_until(fault.at)
            self.history.record("fault", **asdict(fault))
            try:
                self._inject(fault)
            finally:
                self.history.record("healed", kind=fault.kind, target=fault.target)

    def _inject(self, fault: Fault) -> None:
        cluster, network = self.cluster, self.cluster.network
        if fault.kind == "kill":
            cluster.workers[fault.target].kill()
            time.sleep(fault.hold)
            cluster.start_worker(fault.target)
        elif fault.kind == "pause":
            cluster.workers[fault.target].pause()
            time.sleep(fault.hold)
            cluster.workers[fault.target].resume()
        elif fault.kind.startswith("cut_"):
            peers = {"cut_db": ["db"], "cut_temporal": ["temporal"], "cut_sink": ["sink"]}.get(
                fault.kind, ["db", "temporal"]
            )
            network.cut(fault.target, *peers)
            time.sleep(fault.hold)
            network.heal(fault.target)
        elif fault.kind.startswith("slow_"):
            server = fault.kind.removeprefix("slow_")
            cluster.set_latency(fault.target, server, fault.delay)
            time.sleep(fault.hold)
            cluster.set_latency(fault.target, server, 0)
        elif fault.kind == "restart_postgres":
            cluster.postgres.stop()  # SIGINT: PostgreSQL's fast shutdown
            time.sleep(fault.hold)
            cluster.postgres.launch()
            cluster.postgres.wait_ready()
        elif fault.kind == "restart_temporal":
            cluster.temporal.stop()  # SIGTERM; its workflows are in its database file
            time.sleep(fault.hold)
            cluster.temporal.launch()
            cluster.temporal.wait_ready()
        elif fault.kind == "kill_driver":
            assert cluster.spark is not None
            self.history.record("drivers_killed", count=cluster.spark.kill_drivers())
            time.sleep(fault.hold)

    def heal_all(self) -> None:
        for name in self.cluster.worker_names:
            self.cluster.network.heal(name)
            for server in self.cluster.proxies:
                self.cluster.set_latency(name, server, 0)
            worker = self.cluster.workers[name]
            if worker.running():
                worker.resume()
            else:
                self.cluster.start_worker(name)

    def outcomes(self, timeout: float = 600) -> dict[str, dict[str, Any]]:
        """Each started procedure's status once it ended (or as last seen, if it did not
        within `timeout`), with when it closed; each written to the history as "ended". A
        start that never got its answer may have started one: it is looked for too."""
        started = [event["procedure_id"] for event in self.history.of("started")]
        unanswered = [event["procedure_id"] for event in self.history.of("not_started")]
        if self.with_spark:  # the compaction Schedule's runs are the workload's too
            paused = self.cli("schedule", "pause", BANK_COMPACTION_SCHEDULE, timeout=120)
            assert paused.returncode == 0, paused.stderr
            started += asyncio.run(
                _scheduled_runs(self.cluster.temporal.address, BANK_COMPACTION_SCHEDULE)
            )
        found = asyncio.run(
            procedure_ends(self.cluster.temporal.address, [*started, *unanswered], timeout)
        )
        for procedure_id, status in found.items():
            self.history.record(
                "ended", procedure_id=procedure_id, **{key: status.get(key) for key in ENDED_KEPT}
            )
        return found

    def end_state(self) -> dict[str, Any]:
        """The catalog, the grants and every live worker's caches, after the quiet period."""

        def members() -> set[str]:
            listed = json.loads(self.cli("workers", "list", "--json").stdout)
            return {member["member_id"] for member in listed}

        try:
            # Each look is a `procbus` CLI process: about half a second of a core.
            everyone = set(self.cluster.worker_names)
            wait_until(lambda: members() == everyone, 120, "all live", interval=1.0)
        except AssertionError:
            raise AssertionError(
                f"after the heal, live workers {sorted(members())} of "
                f"{self.cluster.worker_names}:\n{self.cluster.log_tails(40)}"
            ) from None
        depths = {topic: self._drained(topic) for topic in self.topics}
        requests = self.cluster.sink_requests() if self.with_topics else []
        if self.cluster.kafka is not None:
            requests += _kafka_requests(self.cluster.kafka.bootstrap, KAFKA_TARGET)
        if self.cluster.amqp is not None:
            requests += asyncio.run(_amqp_requests(self.cluster.amqp.url, AMQP_QUEUE))
        tables = json.loads(self.cli("table", "list", "--json").stdout)
        grants = json.loads(self.cli("acl", "list", "--json").stdout)
        inspected = json.loads(self.cli("workers", "inspect", "--json").stdout)
        lake = self._lake_state() if self.with_spark else {}
        if self.with_spark:
            lake["pipeline_tables"] = {BANK_TOPIC: table_resource(BANK_NAMESPACE, BANK_TABLE)}
        return lake | {
            "tables": sorted(f"{t['namespace']}.{t['name']}" for t in tables),
            "grants": sorted(_grant_key(g) for g in grants),
            "workers": {
                m["member_id"]: {
                    "tables": sorted(m["report"]["tables"]),
                    "grants": sorted(_grant_key(a) for a in m["report"]["access"]),
                }
                for m in inspected["members"]
                if m.get("report") is not None
            },
            "folders": sorted(
                f"{namespace.name}.{table.name}"
                for namespace in self.cluster.warehouse.iterdir()
                if namespace.is_dir()
                for table in namespace.iterdir()
                if table.is_dir()
            ),
            "folder_makers": _folder_makers(self.cluster.warehouse),
            "topic_depths": depths,
            "lock_log": asyncio.run(self._sql("lock_log")),
            "catalog_log": asyncio.run(self._sql("catalog_log")),
            "catalog_events": asyncio.run(self._sql("catalog_events")),
            "sink_requests": requests,
            "notes": {
                notes.name.removeprefix("notes-"): notes.read_text().splitlines()
                for notes in sorted(self.cluster.root.glob("notes-*"))
            },
        }

    def _lake_state(self) -> dict[str, Any]:
        """Once the pipeline drained and the Spark cluster ran no driver: the bank's accounts
        in PostgreSQL and in the lake, each lake table's files on disk and in its current
        snapshot, every snapshot committed, the jobs' ledger, and the drivers still running."""
        from procbus.lakehouse.catalog import Catalog

        spark = self.cluster.spark
        assert spark is not None
        depth = self._drained(BANK_TOPIC, timeout=300)  # a batch's apply starts a Spark session

        def active_drivers() -> list[Any]:
            with contextlib.suppress(Exception):
                return list(spark.state().get("activedrivers", []))
            return ["the master did not answer"]

        with contextlib.suppress(AssertionError):
            wait_until(lambda: not active_drivers(), 60, "no driver running", interval=1.0)

        async def read() -> dict[str, Any]:
            pool = await create_pool(self.cluster.database_url, min_size=1, max_size=2)
            try:
                queries = load_queries("procbus.testing")
                source = [dict(row) for row in await pool.fetch(queries["bank_accounts"])]
                lake = await asyncio.to_thread(
                    rows_read_by_pyiceberg,
                    self.cluster.database_url,
                    f"{BANK_NAMESPACE}.{BANK_TABLE}",
                )
                catalog = Catalog(pool)
                listed = {
                    table.qualified_name: {
                        "location": table.location,
                        "live": sorted(await catalog.listed_files(table.namespace, table.name)),
                    }
                    for table in await catalog.list_tables()
                }
                return {"bank_source": source, "bank_lake": lake, "lake_files": listed}
            finally:
                await pool.close()

        state = asyncio.run(read())
        for table in state["lake_files"].values():
            folder = Path(table["location"])
            table["on_disk"] = sorted(  # Iceberg's metadata/ is pyiceberg's to keep
                path.relative_to(folder).as_posix()
                for path in folder.rglob("*")
                if path.is_file()
                and path.name != MARKER
                and path.relative_to(folder).parts[0] != METADATA_FOLDER
            )
        pipeline = self.cli("pipeline", "status", BANK_TOPIC, "--json")
        return state | {
            "bank_depth": depth,
            "pipeline": json.loads(pipeline.stdout) if pipeline.returncode == 0 else None,
            "snapshot_log": asyncio.run(self._sql("snapshot_log")),
            "spark_jobs": asyncio.run(self._sql("spark_jobs")),
            "spark_drivers": {"active": active_drivers(), "processes": spark.drivers()},
        }

    def _drained(self, topic: str, timeout: float = 120) -> int:
        """The topic's depth once it is 0 (or after `timeout`): every committed event was
        delivered, or the checker says which were not."""
        depth = -1

        def empty() -> bool:
            nonlocal depth
            shown = self.cli("topic", "stats", topic, "--json")
            depth = json.loads(shown.stdout)["depth"] if shown.returncode == 0 else -1
            return depth == 0

        with contextlib.suppress(AssertionError):
            wait_until(empty, timeout, f"{topic} drained", interval=1.0)
        return depth


async def _open_bank(database_url: str) -> None:
    """The bank's accounts, each opened with BANK_OPENING."""
    queries = load_queries("procbus.testing")
    connection = await asyncpg.connect(database_url, timeout=30)
    try:
        await connection.execute(queries["install_bank"])
        await connection.execute(queries["open_bank_accounts"], BANK_OPENING, BANK_ACCOUNTS)
    finally:
        await connection.close()


async def _declare_queue(url: str, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)


async def _amqp_requests(url: str, queue: str) -> list[dict[str, Any]]:
    """Every message of the queue, in the order it holds them, each as a request of path
    "/amqp" with its events (the body: one event, or a batch's list)."""
    requests: list[dict[str, Any]] = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        source = await channel.declare_queue(queue, durable=True)
        while (message := await source.get(fail=False)) is not None:
            loaded = json.loads(message.body)
            requests.append(
                {"path": "/amqp", "events": loaded if isinstance(loaded, list) else [loaded]}
            )
            await message.ack()
    return requests


def _kafka_requests(bootstrap: str, topic: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Every record of the Kafka topic a read_committed consumer reads from its start to its
    end, each as a request of path "/kafka" holding one event (its value)."""
    from procbus.delivery.kafka import read_committed  # confluent-kafka loads only for the check

    try:
        records = read_committed(bootstrap, topic, None, timeout_seconds=timeout)
    except TimeoutError as error:
        raise AssertionError(str(error)) from None
    return [{"path": "/kafka", "events": [record.value]} for record in records]


async def _scheduled_runs(address: str, schedule_id: str) -> list[str]:
    """The IDs of the procedures the schedule started (Temporal's visibility)."""
    client = await Client.connect(address, data_converter=procbus_data_converter)
    query = f'TemporalScheduledById = "{schedule_id}"'
    return [execution.id async for execution in client.list_workflows(query)]


async def procedure_ends(
    address: str, procedure_ids: list[str], seconds: float
) -> dict[str, dict[str, Any]]:
    """Through one client: each procedure's end, as `procbus proc status --json` shows it, and
    when it closed (the order X locks let them commit in). A procedure is waited for by
    Temporal's own record, not by asking its workers: a run whose workflow tasks are failing for
    now cannot answer a query, and is still running. When it started is Temporal's too (the
    start of its first run: a procedure continues as new under the same ID)."""
    client = await Client.connect(address, data_converter=procbus_data_converter)
    deadline = time.monotonic() + seconds
    found: dict[str, dict[str, Any]] = {}
    for procedure_id in procedure_ids:
        handle = client.get_workflow_handle(procedure_id)
        try:
            described = await handle.describe()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                continue  # a start that never reached Temporal
            raise
        started_at = await _first_run_start(client, described)
        next_look = time.monotonic() + STUCK_LOOK_SECONDS
        while described.close_time is None and time.monotonic() < deadline:
            # A STUCK procedure waits for an operator and stays open: no sense waiting on it
            # (seen: one STUCK delete held the whole run for the 600 s of the timeout).
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + STUCK_LOOK_SECONDS
                if await _is_stuck(client, procedure_id):
                    break
            await asyncio.sleep(0.5)
            described = await handle.describe()
        if described.close_time is None:  # never ended: the checker says so, and on what
            found[procedure_id] = {
                "state": None,
                "started_at": started_at.isoformat(),
                "error": f"still {described.status.name if described.status else 'RUNNING'}",
                "pending": [
                    f"{pending.activity_type.name} attempt {pending.attempt}: "
                    f"{pending.last_failure.message}"
                    for pending in described.raw_description.pending_activities
                ],
            }
            with contextlib.suppress(ProcbusError):
                last = await procedure_status(client, procedure_id, query_timeout=5)
                found[procedure_id]["last_seen"] = last.model_dump(mode="json")
                if last.state.value == "STUCK":  # it ended: it waits for an operator, open
                    found[procedure_id] = last.model_dump(mode="json") | {
                        "started_at": started_at.isoformat(),
                        "closed_at": None,
                    }
            continue
        status = await procedure_status(client, procedure_id, query_timeout=30)
        found[procedure_id] = status.model_dump(mode="json") | {
            "started_at": started_at.isoformat(),
            "closed_at": described.close_time.isoformat(),
        }
    return found


async def _is_stuck(client: Client, procedure_id: str) -> bool:
    """Whether the procedure says it is STUCK (False when no worker answers now)."""
    try:
        status = await procedure_status(client, procedure_id, query_timeout=5)
    except ProcbusError:
        return False
    return status.state.value == "STUCK"


async def _first_run_start(client: Client, described: WorkflowExecutionDescription) -> datetime:
    """When the procedure's first run started (its deadline counts from there)."""
    first_run_id = described.raw_description.workflow_execution_info.first_run_id
    if not first_run_id or first_run_id == described.run_id:
        return described.start_time
    first = await client.get_workflow_handle(described.id, run_id=first_run_id).describe()
    return first.start_time


def _grant_key(grant: dict[str, Any]) -> str:
    return f"{grant['principal']}:{grant['namespace']}.{grant['table']}:{grant['permission']}"


@dataclass
class Report:
    """A finished run: what it did, the cluster's state after the quiet period, and each
    checker's violations."""

    run: Run
    outcomes: dict[str, dict[str, Any]]
    end: dict[str, Any]
    violations: dict[str, list[str]]


def run_on_a_new_cluster(
    seed: int,
    seconds: float,
    procbus: str,
    workers: int = 3,
    history: Path | None = None,
    worker_modules: Sequence[str] = (USER_MODULE,),
    *,
    latency: bool = True,
    amqp: bool = True,
    spark: bool = False,
    operations_per_second: float = OPERATIONS_PER_SECOND,
) -> Report:
    """A cluster of `workers` workers and a sink (with a Kafka broker) up for one run from
    `seed` (bench/nemesis.py's and the short run of `make test`), torn down after it; its
    history written to `history`, also when the run failed. The workers run the user's
    procedures of `worker_modules` too, imported from the folder this runs in (the project's,
    for examples.user_procedures). `latency`: the latency proxies and their faults; `amqp`: a
    RabbitMQ broker on the sink host and a topic delivered to it; `spark`: a Spark cluster on
    its own host, with loads, compactions, the bank's change pipeline and driver kills (checked by
    the lake and Spark checkers); `operations_per_second`: the workload's rate of table
    procedures and grants."""
    with running_cluster(
        workers,
        member_timeout_seconds=5.0,
        sink=True,
        worker_modules=worker_modules,
        latency=latency,
        kafka=True,
        amqp=amqp,
        spark=spark,
    ) as cluster:
        run = Run(cluster, seed, seconds, procbus, operations_per_second)
        try:
            run.setup()
            run.run()
            outcomes = run.outcomes()
            end = run.end_state()
        finally:
            if history is not None:
                run.history.write(history)
        if history is not None:  # the end state beside it, for a reader of a failed run
            history.with_suffix(".end.json").write_text(json.dumps(end, default=str))
    return Report(run, outcomes, end, verdicts(outcomes, end, run.history))


def recheck(history_path: Path) -> tuple[History, dict[str, dict[str, Any]], dict[str, Any]]:
    """A finished run's history, each procedure's end and the end state, as `--history` saved
    them (the end state beside it, .end.json), for the checkers to run again (verdicts)."""
    history = History(
        events=[json.loads(line) for line in history_path.read_text().splitlines() if line]
    )
    end: dict[str, Any] = json.loads(history_path.with_suffix(".end.json").read_text())
    outcomes = {event["procedure_id"]: dict(event) for event in history.of("ended")}
    for started in history.of("started"):
        argv, status = started.get("argv") or [], outcomes.get(started["procedure_id"])
        kind = _COMMAND_TYPES.get(tuple(argv[:2]))
        if status is not None and kind is not None and status.get("procedure_type") is None:
            status.update(procedure_type=kind, target=argv[2])
    return history, outcomes, end


# ---- checkers: each returns the violations it found, as sentences ----


def check_procedures(outcomes: dict[str, dict[str, Any]]) -> list[str]:
    """Every procedure ended SUCCEEDED, ROLLED_BACK, or STUCK with its reason."""
    violations = []
    for procedure_id, status in sorted(outcomes.items()):
        state = status.get("state")
        if state not in ENDED:
            violations.append(f"{procedure_id} did not end: {state}")
        elif state == "STUCK" and not status.get("stuck_error"):
            violations.append(f"{procedure_id} is STUCK without a reason")
    return violations


def check_catalog(outcomes: dict[str, dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """Each table exists at the end exactly when the last procedure that succeeded on it (in
    the order they were granted X on the table, which serializes them; the order they ended,
    for one the lock log lacks) created it, and its folder with it; each
    table procedure that succeeded recorded its catalog event once: a procedure that was
    undone left nothing behind, neither a folder nor an event. A folder whose maker is STUCK
    rolling back is not residue: its undo waits for an operator (retry or skip); nor is a
    table whose last catalog write was made by a procedure that is STUCK (a DeleteTable whose
    locks were lost after it removed the table: its undo waits for an operator too)."""
    succeeded = {
        procedure_id: status
        for procedure_id, status in outcomes.items()
        if status.get("state") == "SUCCEEDED"
        and status.get("procedure_type") in ("CreateTable", "DeleteTable")
    }
    # A procedure releases its locks before its run closes, and the close can come much later
    # (a worker paused between): the one that ended last need not have changed the table last.
    granted = _first_x_holders(end, succeeded)
    last: dict[str, tuple[str, str]] = {}
    for procedure_id, status in sorted(succeeded.items(), key=lambda item: _ended_at(item[1])):
        last[status["target"]] = (status["procedure_type"], procedure_id)
    for resource, holders in granted.items():
        table = resource.replace("/", ".")
        if holders and table in last:
            last[table] = (succeeded[holders[-1]]["procedure_type"], holders[-1])
    operators = {
        table
        for table, writer in last_table_writers(end).items()
        if outcomes.get(writer, {}).get("state") == "STUCK"
        and outcomes[writer].get("procedure_type") in ("CreateTable", "DeleteTable")
    }
    violations = []
    for table in sorted({*last, *end["tables"]} - operators):
        expected = table in last and last[table][0] == "CreateTable"
        if expected != (table in end["tables"]):
            said = last.get(table, ("nothing", "-"))
            violations.append(
                f"{table}: {'missing' if expected else 'present'} in the catalog, but the last "
                f"procedure that succeeded on it was {said[0]} {said[1]}"
            )
    makers = end.get("folder_makers", {})
    for table in sorted((set(end["folders"]) ^ set(end["tables"])) - operators):
        if outcomes.get(makers.get(table, ""), {}).get("state") == "STUCK":
            continue  # its maker's undo waits for an operator: not undone, so no residue yet
        where = "a folder without a catalog entry" if table in end["folders"] else "no folder"
        violations.append(f"{table}: {where} (residue of an undone or half-done procedure)")
    recorded = collections.Counter(
        (event["procedure_id"], event["event_type"]) for event in end.get("catalog_events", [])
    )
    for procedure_id, status in sorted(outcomes.items()):
        event_type = TABLE_EVENTS.get(status.get("procedure_type", ""))
        if event_type is None or status.get("state") not in ("SUCCEEDED", "ROLLED_BACK"):
            continue
        once = 1 if status["state"] == "SUCCEEDED" else 0
        if recorded[(procedure_id, event_type)] != once:
            violations.append(
                f"{procedure_id} {status['state']}, and its {event_type} event was recorded "
                f"{recorded[(procedure_id, event_type)]} times"
            )
    return violations


def last_table_writers(end: dict[str, Any]) -> dict[str, str]:
    """Each table's last writer of its catalog row: the holder of the lock whose fence the
    write carried (from the lock log), by table ("namespace.name")."""
    holders = {
        (change["resource"], change["token"]): change["holder"]
        for change in end.get("lock_log", [])
        if change["token"] is not None
    }
    writers = {}
    for write in sorted(end.get("catalog_log", []), key=lambda w: datetime.fromisoformat(w["at"])):
        if write["relation"] != "procbus_tables" or write["fence"] is None:
            continue
        row, fence = json.loads(write["row"]), json.loads(write["fence"])
        writer = holders.get((fence["resource"], fence["token"]))
        if writer is not None:
            writers[f"{row['namespace']}.{row['name']}"] = writer
    return writers


# The catalog event each table procedure records once it succeeded (its last step).
TABLE_EVENTS = {"CreateTable": "TableCreated", "DeleteTable": "TableDeleted"}


def check_caches(end: dict[str, Any], evicted: AbstractSet[str] = frozenset()) -> list[str]:
    """After the heal, every live worker's caches (tables, grants) equal the catalog. A worker
    keeps a deleted table's grants, unused, until a table of that name is created again (which
    drops them first: docs/concepts/bus.md); those are not counted. A table the user's procedure
    evicted last (`evicted`) may be missing from a worker's cache, which reads it again when it
    is used."""
    violations = []
    for worker, caches in sorted(end["workers"].items()):
        in_use = {
            "tables": caches["tables"],
            "grants": [g for g in caches["grants"] if _grant_table(g) in end["tables"]]
            + [g for g in caches["grants"] if _grant_table(g).endswith(".*")],
        }
        for what in ("tables", "grants"):
            missing = sorted(
                item
                for item in set(end[what]) - set(in_use[what])
                if (item if what == "tables" else _grant_table(item)) not in evicted
            )
            extra = sorted(set(in_use[what]) - set(end[what]))
            if missing or extra:
                violations.append(
                    f"{worker}'s {what} differ from the catalog: missing {missing}, extra {extra}"
                )
    return violations


def check_topics(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """Every event of a committed transaction was delivered (at least once), none of a
    transaction that did not commit ever was, a transaction whose commit failed was delivered
    whole or not at all, per topic and key the first deliveries came in commit order, and no
    request of the grouped topic held part of a transaction."""
    committed: dict[tuple[str, int], tuple[str, str]] = {}  # (txn, n) -> (topic, key)
    not_committed: set[tuple[str, int]] = set()
    unknown: dict[str, set[int]] = {}
    order: list[tuple[str, int]] = []  # the events that may be delivered, in commit order
    events_of: dict[tuple[str, str], set[int]] = collections.defaultdict(set)  # (txn, topic)
    for recorded in history:
        if recorded["event"] != "txn":
            continue
        for n, (topic, key) in enumerate(recorded["events"]):
            event = (recorded["txn"], n)
            if recorded["outcome"] in ("committed", "unknown"):
                committed[event] = (topic, key)
                order.append(event)
                events_of[(recorded["txn"], topic)].add(n)
                if recorded["outcome"] == "unknown":
                    unknown.setdefault(recorded["txn"], set()).add(n)
            else:
                not_committed.add(event)
    first_seen: dict[tuple[str, int], int] = {}
    violations = []
    for index, request in enumerate(end["sink_requests"]):
        by_txn: dict[str, set[int]] = collections.defaultdict(set)
        for body in request["events"]:
            event = (body["data"]["txn"], body["data"]["n"])
            first_seen.setdefault(event, index)
            by_txn[event[0]].add(event[1])
            if event in not_committed:
                violations.append(f"{event[0]}#{event[1]} was delivered, but never committed")
            elif event not in committed:
                violations.append(f"{event[0]}#{event[1]} was delivered, but never published")
            elif committed[event] != (body["topic"], body["key"]):
                violations.append(f"{event[0]}#{event[1]} came as {body['topic']}/{body['key']}")
        if request["path"] == TOPIC_PATHS[GROUPED_TOPIC].split("?")[0]:
            for txn, numbers in sorted(by_txn.items()):
                whole = events_of.get((txn, GROUPED_TOPIC), set())
                if numbers != whole:
                    violations.append(
                        f"a grouped batch held {sorted(numbers)} of {txn}'s {sorted(whole)}"
                    )
    for txn, numbers in sorted(unknown.items()):
        seen = {n for n in numbers if (txn, n) in first_seen}
        if seen and seen != numbers:
            violations.append(f"{txn} (commit unknown) was delivered in part: {sorted(seen)}")
    lost = [e for e in order if e not in first_seen and e[0] not in unknown]
    violations += [f"{txn}#{n} was committed but never delivered" for txn, n in lost]
    by_key: dict[tuple[str, str], list[tuple[str, int]]] = collections.defaultdict(list)
    for event in order:
        if event in first_seen:
            by_key[committed[event]].append(event)
    for (topic, key), events in sorted(by_key.items()):
        arrived = sorted(events, key=lambda event: first_seen[event])
        if arrived != events:
            out_of_order = next(a for a, b in zip(arrived, events, strict=True) if a != b)
            violations.append(
                f"{topic}/{key}: {out_of_order[0]}#{out_of_order[1]} arrived out of commit order"
            )
    if any(depth != 0 for depth in end.get("topic_depths", {}).values()):
        violations.append(f"topics not drained after the heal: {end['topic_depths']}")
    return violations


def check_locks(end: dict[str, Any]) -> list[str]:
    """No two incompatible grants on one resource overlapped in time: replaying every change of
    the lock table, when a holder is granted a mode, no other holder (outside its family of
    parent procedures) holds an incompatible one there with its lease still running."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # (resource, holder) -> its row now
    violations = []
    for change in end.get("lock_log", []):
        key = (change["resource"], change["holder"])
        before = rows.pop(key, None)
        if change["op"] == "DELETE":
            continue
        rows[key] = change
        granted = change["token"] is not None and (
            before is None or (before["token"], before["mode"]) != (change["token"], change["mode"])
        )
        if not granted:
            continue
        at = datetime.fromisoformat(change["at"])
        for (resource, holder), other in rows.items():
            if resource != change["resource"] or holder == change["holder"]:
                continue
            if other["token"] is None or datetime.fromisoformat(other["lease_expires_at"]) <= at:
                continue  # waiting, or its lease ran out: no longer held
            if holder in change["family"] or change["holder"] in other["family"]:
                continue
            if not compatible(LockMode(other["mode"]), LockMode(change["mode"])):
                violations.append(
                    f"{resource}: {change['holder']} was granted {change['mode']} at "
                    f"{change['at']} while {holder} held {other['mode']} (leased until "
                    f"{other['lease_expires_at']})"
                )
    return violations


def check_deadlines(
    history: list[dict[str, Any]], outcomes: dict[str, dict[str, Any]]
) -> list[str]:
    """No procedure ran past its deadline unnoticed: one that ended SUCCEEDED more than the
    grace after its deadline must have passed its pivot first (its status then records the
    deadline's rollback as refused). A rollback for another reason may have begun before the
    deadline, so it is not counted; one that never ended is the procedures checker's."""
    deadlines = {
        recorded["procedure_id"]: recorded["deadline_seconds"]
        for recorded in history
        if recorded["event"] in ("started", "not_started") and recorded.get("deadline_seconds")
    }
    violations = []
    for procedure_id, deadline in sorted(deadlines.items()):
        status = outcomes.get(procedure_id, {})
        if status.get("state") != "SUCCEEDED" or not status.get("closed_at"):
            continue
        ran = (
            datetime.fromisoformat(status["closed_at"])
            - datetime.fromisoformat(status["started_at"])
        ).total_seconds()
        noticed = any("its deadline passed" in refusal for refusal in status.get("refused", []))
        if ran > deadline + DEADLINE_GRACE_SECONDS and not noticed:
            violations.append(
                f"{procedure_id} SUCCEEDED {ran:.1f} s after its start, past its deadline of "
                f"{deadline:g} s, and its status says nothing of the deadline"
            )
    return violations


# The lock resource a write to each catalog relation needs (or an ancestor's), from its row.
WRITTEN_RESOURCE: dict[str, Callable[[dict[str, Any]], str]] = {
    "procbus_namespaces": lambda row: namespace_resource(row["name"]),
    "procbus_namespace_acl": lambda row: namespace_resource(row["namespace"]),
    "procbus_tables": lambda row: table_resource(row["namespace"], row["name"]),
    "procbus_acl": lambda row: table_resource(row["namespace"], row["table_name"]),
    "procbus_events": lambda row: (
        table_resource(row["namespace"], row["table_name"])
        if row["table_name"]
        else namespace_resource(row["namespace"])
    ),
}


def check_fencing(end: dict[str, Any]) -> list[str]:
    """Every write that reached the catalog carried a fence covering what it wrote, and when it
    was written that fence's locks were still held and, for an exclusive write, its token the
    newest on its resource (an append under an IX lock shares it with others): replaying the
    lock log and the catalog log together, in the database's time order. A change pipeline's
    commit carries its batch instead (its claim fences it), and may write only its own lake
    table (`pipeline_tables`: topic -> table resource)."""
    changes = [(change["at"], 0, change) for change in end.get("lock_log", [])]
    changes += [(write["at"], 1, write) for write in end.get("catalog_log", [])]
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # (resource, holder) -> its lock row now
    newest: dict[str, int] = {}  # resource -> the newest token granted on it
    violations = []
    for _, is_write, change in sorted(changes, key=lambda c: (datetime.fromisoformat(c[0]), c[1])):
        if not is_write:
            key = (change["resource"], change["holder"])
            rows.pop(key, None)
            if change["op"] != "DELETE":
                rows[key] = change
                if change["token"] is not None:
                    newest[key[0]] = max(newest.get(key[0], 0), change["token"])
            continue
        row = json.loads(change["row"])
        written = WRITTEN_RESOURCE[change["relation"]](row)
        what = f"{change['op']} on {change['relation']} ({written}) at {change['at']}"
        if change["fence"] is None and change.get("batch") is not None:
            topic = json.loads(change["batch"])["topic"]
            if end.get("pipeline_tables", {}).get(topic) != written:
                violations.append(f"{what} was written by a batch of pipeline {topic}")
            continue
        if change["fence"] is None:
            violations.append(f"{what} carried no fence")
            continue
        fence = Fence.model_validate_json(change["fence"])
        if written != fence.resource and not written.startswith(f"{fence.resource}/"):
            violations.append(
                f"{what} carried a fence on {fence.resource}, which does not cover it"
            )
        for resource, token in [(fence.resource, fence.token)] + [
            (grant.resource, grant.token) for grant in fence.path
        ]:
            if not any(r == resource and lock["token"] == token for (r, _), lock in rows.items()):
                violations.append(f"{what}: its lock on {resource} (token {token}) was not held")
        if fence.mode is LockMode.X and fence.token < newest.get(fence.resource, 0):
            violations.append(
                f"{what}: its token {fence.token} on {fence.resource} was older than the newest, "
                f"{newest[fence.resource]}"
            )
    return violations


def check_access(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """No data change was made as a principal whose grant was revoked before it began.

    The workload deletes tables as `etl` (deleting a table's data is writing it). On a table,
    every procedure that changes it or its grants (create, delete, grant, revoke) holds its X
    lock, so the lock log orders them. Replayed in that order: etl may write the table once a
    grant of write on it succeeded, until a revoke of it or the table's deletion (which takes its
    grants) succeeded. An etl deletion that succeeded while etl could not write is a violation.
    After a change that never ended, or ended STUCK, the table's grants are unknown until the
    next one that succeeded."""
    commands = _commands(history, "procbus")
    ends = _ends(history)
    granted_first = _first_x_holders(end, commands)
    violations = []
    for table in sorted({_table_of(argv) for argv in commands.values()}):
        may_write: bool | None = False  # None: unknown
        since = "never granted it"  # why etl may not write, for the violation's sentence
        for procedure_id in granted_first[table_resource(*table.split("."))]:
            argv, state = commands[procedure_id], ends.get(procedure_id, {}).get("state")
            action = argv[1]
            as_deleter = action == "delete" and "--as" in argv
            if as_deleter and state == "SUCCEEDED" and may_write is False:
                violations.append(
                    f"{procedure_id} deleted {table} as {DELETER}, who could not write it: {since}"
                )
            if state not in ("SUCCEEDED", "ROLLED_BACK"):
                may_write = None  # half-done, or never ended: unknown until the next change
            elif state == "SUCCEEDED" and action in ("create", "delete"):
                # A new table has no grants; a deleted one took them.
                may_write, since = False, f"{procedure_id} {action}d the table"
            elif state == "SUCCEEDED" and argv[2:3] == [DELETER] and argv[4:5] == ["write"]:
                may_write, since = action == "grant", f"{procedure_id} revoked it"
    return violations


def check_notes(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """The user's procedure left its note exactly when it succeeded: one line keyed by its step
    in its table's notes for each that SUCCEEDED, none for one ROLLED_BACK (its undo took it
    away), and no line of a procedure the workload never started."""
    refreshes = _commands(history, "temporal")
    ends = _ends(history)
    written = collections.Counter(
        (table, line.split(" ")[0])
        for table, lines in end.get("notes", {}).items()
        for line in lines
    )
    violations = []
    for procedure_id, argv in sorted(refreshes.items()):
        table = json.loads(argv[argv.index("--input") + 1])["table"]
        state, lines = (
            ends.get(procedure_id, {}).get("state"),
            written[(table, f"{procedure_id}/note")],
        )
        if state == "SUCCEEDED" and lines != 1:
            violations.append(
                f"{procedure_id} SUCCEEDED, and its note is in {table}'s notes {lines} times"
            )
        elif state == "ROLLED_BACK" and lines:
            violations.append(
                f"{procedure_id} was ROLLED_BACK, and its note is still in {table}'s notes"
            )
    known = {
        (json.loads(argv[argv.index("--input") + 1])["table"], f"{pid}/note")
        for pid, argv in refreshes.items()
    }
    for table, key in sorted(set(written) - known):
        violations.append(f"{table}'s notes hold {key}, of no procedure the workload started")
    return violations


def evicted_tables(history: list[dict[str, Any]], end: dict[str, Any]) -> set[str]:
    """The tables the user's procedure was the last to evict from the workers' caches, or a
    table procedure left STUCK for its operator (its undo may have evicted the table before the
    step that is stuck), in the order of their X locks, after the last creation or deletion that
    succeeded: a worker may rightly not have them cached (it reads them again when used)."""
    commands = _commands(history, "procbus") | _commands(history, "temporal")
    ends = _ends(history)
    evicted = set()
    for resource, holders in _first_x_holders(end, commands).items():
        last_evicted = False
        for procedure_id in holders:
            argv = commands[procedure_id]
            state = ends.get(procedure_id, {}).get("state")
            table_procedure = argv[:2] in (["table", "create"], ["table", "delete"])
            if argv[0] == "workflow" or (table_procedure and state == "STUCK"):
                last_evicted = True  # an eviction (whether the procedure then failed or not)
            elif table_procedure and state == "SUCCEEDED":
                last_evicted = False
        if last_evicted:
            evicted.add(resource.replace("/", "."))
    return evicted


def _commands(history: list[dict[str, Any]], program: str) -> dict[str, list[str]]:
    """The workload's commands of `program` (procbus or temporal), by procedure ID."""
    return {
        recorded["procedure_id"]: recorded["argv"]
        for recorded in history
        if recorded["event"] in ("started", "not_started")
        and recorded.get("program", "procbus") == program
    }


def _ends(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        recorded["procedure_id"]: recorded for recorded in history if recorded["event"] == "ended"
    }


def _first_x_holders(end: dict[str, Any], known: Container[str]) -> dict[str, list[str]]:
    """Per lock resource, the `known` procedures in the order each was first granted X on it:
    the order their changes to it took effect."""
    holders: dict[str, list[str]] = collections.defaultdict(list)
    for change in end.get("lock_log", []):
        ordered, holder = holders[change["resource"]], change["holder"]
        granted = change["token"] is not None and change["mode"] == "X"
        if granted and holder in known and holder not in ordered:
            ordered.append(holder)
    return holders


def _table_of(argv: list[str]) -> str:
    """The table a workload command acts on: `table ACTION NS.T ...`, `acl ACTION WHO NS.T`."""
    return argv[2] if argv[0] == "table" else argv[3]


def _folder_makers(warehouse: Path) -> dict[str, str | None]:
    """Each table folder's maker (NS.TABLE -> the procedure its marker names; None: none)."""
    makers: dict[str, str | None] = {}
    for marker in warehouse.glob(f"*/*/{MARKER}"):
        with contextlib.suppress(OSError, ValueError):
            made_by = json.loads(marker.read_text()).get("created_by")
            makers[f"{marker.parent.parent.name}.{marker.parent.name}"] = made_by
    return makers


def _grant_table(grant: str) -> str:
    return grant.rsplit(":", 2)[1]  # a principal may hold ":" (pipeline:TOPIC)


def _ended_at(status: dict[str, Any]) -> str:
    return str(status.get("closed_at") or "")


def rows_read_by_pyiceberg(database_url: str, table: str) -> list[dict[str, Any]]:
    """A lake table's current rows as pyiceberg's own SqlCatalog reads them from procbus's
    database: no procbus code between the checker and the Iceberg table."""
    from pyiceberg.catalog.sql import SqlCatalog

    from procbus.lakehouse.iceberg import CATALOG_NAME

    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    catalog = SqlCatalog(CATALOG_NAME, uri=uri)
    try:
        rows: list[dict[str, Any]] = catalog.load_table(table).scan().to_arrow().to_pylist()
    finally:
        catalog.engine.dispose()
    return rows


def check_lake(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """The bank's lake table: every snapshot a reader read during the run kept the bank's total
    (no half-applied transfer), and at the end it equals the source row for row. Every lake
    table's folder holds exactly its current snapshot's files: none missing, none that no
    snapshot lists (an undone or killed attempt's), no staging left."""
    violations = []
    total = BANK_ACCOUNTS * BANK_OPENING
    for read in history:  # (a read before the first batch was applied finds no snapshot)
        if read["event"] == "lake_read" and read["snapshot_id"] and read["total"] != total:
            violations.append(
                f"at {read['t']} s a reader read snapshot {read['snapshot_id']} of the bank's "
                f"lake table totalling {read['total']}, not {total}"
            )
    if end["bank_depth"] != 0:
        violations.append(
            f"the bank's pipeline did not drain: {end['bank_depth']} changes queued "
            f"(status: {end['pipeline']})"
        )
    source = {row["id"]: row for row in end["bank_source"]}
    lake = {row["id"]: row for row in end["bank_lake"]}
    differ = sorted(key for key in {*source, *lake} if source.get(key) != lake.get(key))
    if differ:
        shown = ", ".join(f"{key}: {source.get(key)} vs {lake.get(key)}" for key in differ[:5])
        violations.append(
            f"the bank's lake table differs from its source in {len(differ)} accounts: {shown}"
        )
    for table, files in sorted(end["lake_files"].items()):
        live, on_disk = set(files["live"]), set(files["on_disk"])
        for path in sorted(live - on_disk):
            violations.append(f"{table}: {path} is listed by its current snapshot but missing")
        for path in sorted(on_disk - live):
            violations.append(f"{table}: {path} is on disk but no current snapshot lists it")
    return violations


def check_spark(outcomes: dict[str, dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """One committed attempt per job: no job committed two snapshots; a load that succeeded
    committed one, a compaction at most one (of nothing to compact, none), one undone none; no
    job's ledger row is left running or staged, and no driver is left running."""
    violations = []
    commits = collections.Counter(  # an expiry's commit has no job
        (entry["namespace"], entry["table_name"], entry["job_key"])
        for entry in end["snapshot_log"]
        if entry["job_key"]
    )
    for (namespace, table, job_key), count in sorted(commits.items()):
        if count > 1:
            violations.append(f"{namespace}.{table}: job {job_key} committed {count} snapshots")
    by_procedure = collections.Counter(entry["procedure_id"] for entry in end["snapshot_log"])
    for procedure_id, status in sorted(outcomes.items()):
        kind, state = status.get("procedure_type"), status.get("state")
        if kind not in ("LoadTable", "CompactTable") or state not in ENDED - {"STUCK"}:
            continue
        allowed = {"LoadTable": {1}, "CompactTable": {0, 1}}[kind] if state == "SUCCEEDED" else {0}
        if by_procedure[procedure_id] not in allowed:
            violations.append(
                f"{procedure_id} ({kind}) {state} and committed {by_procedure[procedure_id]} "
                "snapshots"
            )
    stuck = {pid for pid, status in outcomes.items() if status.get("state") == "STUCK"}
    for job in end["spark_jobs"]:
        if job["state"] in ("running", "staged") and job["procedure_id"] not in stuck:
            violations.append(
                f"job {job['job_key']} of {job['procedure_id']} is left {job['state']} "
                f"(attempt {job['attempt']})"
            )
    drivers = end["spark_drivers"]
    if drivers["active"] or drivers["processes"]:
        violations.append(
            f"drivers left running: the master lists {drivers['active']}, processes "
            f"{drivers['processes']}"
        )
    return violations


def verdicts(
    outcomes: dict[str, dict[str, Any]], end: dict[str, Any], history: History
) -> dict[str, list[str]]:
    return {
        "procedures": check_procedures(outcomes),
        "deadlines": check_deadlines(history.events, outcomes),
        "catalog": check_catalog(outcomes, end),
        "caches": check_caches(end, evicted_tables(history.events, end)),
        "topics": check_topics(history.events, end),
        "locks": check_locks(end),
        "fencing": check_fencing(end),
        "access": check_access(history.events, end),
        "notes": check_notes(history.events, end),
        **(
            {"lake": check_lake(history.events, end), "spark": check_spark(outcomes, end)}
            if "spark_jobs" in end
            else {}
        ),
    }

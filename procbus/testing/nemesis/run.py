"""One nemesis run on a test cluster (procbus.testing.cluster): its setup, then the workload's
operations, application transactions and (with Spark) the bank started at their times while
the faults are injected, then the final heal and each procedure's end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg

from procbus.db import create_pool, load_queries
from procbus.hooks import transaction
from procbus.stack import temporal_binary
from procbus.testing.cluster import Cluster
from procbus.testing.nemesis import ends
from procbus.testing.nemesis.faults import (
    FAULT_KINDS,
    FAULT_SECONDS,
    LATENCY_FAULT_KINDS,
    SINK_FAULT_KINDS,
    SPARK_FAULT_KINDS,
    fault_schedule,
    heal_all,
    inject,
)
from procbus.testing.nemesis.history import History
from procbus.testing.nemesis.operations import (
    AMQP_QUEUE,
    AMQP_TOPIC,
    BANK_ACCOUNTS,
    BANK_COMPACTION_EVERY,
    BANK_COMPACTION_SCHEDULE,
    BANK_NAMESPACE,
    BANK_OPENING,
    BANK_SOURCE,
    BANK_TABLE,
    BANK_TOPIC,
    GROUPED_TOPIC,
    KAFKA_TARGET,
    KAFKA_TOPIC,
    LAKE_NAMESPACE,
    LAKE_READ_SECONDS,
    LAKE_TABLES,
    NAMESPACES,
    OPERATIONS_PER_SECOND,
    SCHEDULE_CHECK_SECONDS,
    TOPIC_PATHS,
    TRANSFERS_PER_SECOND,
    USER_MODULE,
    Operation,
    app_transactions,
    arrivals,
    spark_operations,
    user_operations,
    workload,
    write_load_inputs,
)

# What the history keeps of each procedure's end (and of one that never ended, what it waited on).
ENDED_KEPT = (
    *("state", "started_at", "closed_at", "failed_step", "stuck_step", "rollback_reason"),
    *("refused", "broadcasts", "error", "last_seen", "pending", "procedure_type", "target"),
)


class RolledBackOnPurpose(Exception):
    """Raised inside an application transaction the workload rolls back."""


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
        asyncio.run(self.sql("install_lock_log"))
        asyncio.run(self.sql("install_catalog_log"))
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
        asyncio.run(self.sql("install_snapshot_log"))
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
            heal_all(self.cluster)

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
        for number, at in enumerate(arrivals(rng, self.seconds, TRANSFERS_PER_SECOND), 1):
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
        from procbus.lakehouse import Catalog, read_snapshot

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

    async def sql(self, name: str) -> list[dict[str, Any]]:
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
                inject(self.cluster, fault, self.history)
            finally:
                self.history.record("healed", kind=fault.kind, target=fault.target)

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
                ends.scheduled_runs(self.cluster.temporal.address, BANK_COMPACTION_SCHEDULE)
            )
        found = asyncio.run(
            ends.procedure_ends(self.cluster.temporal.address, [*started, *unanswered], timeout)
        )
        for procedure_id, status in found.items():
            self.history.record(
                "ended", procedure_id=procedure_id, **{key: status.get(key) for key in ENDED_KEPT}
            )
        return found

    def end_state(self) -> dict[str, Any]:
        """The catalog, the grants and every live worker's caches, after the quiet period."""
        return ends.end_state(self)


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

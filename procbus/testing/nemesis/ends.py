"""What a nemesis run ends with, read once its faults are healed: each procedure's end, as
Temporal and the procedure itself say it (procedure_ends), and the cluster's end state, which
the checkers read beside the history (end_state)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError, RPCStatusCode

from procbus.core import table_resource
from procbus.db import create_pool, load_queries
from procbus.errors import ProcbusError
from procbus.lakehouse.naming import METADATA_FOLDER
from procbus.lakehouse.warehouse import MARKER
from procbus.procedures import procedure_status
from procbus.temporal import procbus_data_converter
from procbus.testing.cluster import wait_until
from procbus.testing.nemesis.operations import (
    AMQP_QUEUE,
    BANK_NAMESPACE,
    BANK_TABLE,
    BANK_TOPIC,
    KAFKA_TARGET,
)

if TYPE_CHECKING:
    from procbus.testing.nemesis.run import Run

# How often the wait for a procedure's end asks whether it is STUCK (a query to its worker).
STUCK_LOOK_SECONDS = 5.0


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


async def scheduled_runs(address: str, schedule_id: str) -> list[str]:
    """The IDs of the procedures the schedule started (Temporal's visibility)."""
    client = await Client.connect(address, data_converter=procbus_data_converter)
    query = f'TemporalScheduledById = "{schedule_id}"'
    return [execution.id async for execution in client.list_workflows(query)]


def end_state(run: Run) -> dict[str, Any]:
    """The catalog, the grants and every live worker's caches, after the quiet period."""

    def members() -> set[str]:
        listed = json.loads(run.cli("workers", "list", "--json").stdout)
        return {member["member_id"] for member in listed}

    try:
        # Each look is a `procbus` CLI process: about half a second of a core.
        everyone = set(run.cluster.worker_names)
        wait_until(lambda: members() == everyone, 120, "all live", interval=1.0)
    except AssertionError:
        raise AssertionError(
            f"after the heal, live workers {sorted(members())} of "
            f"{run.cluster.worker_names}:\n{run.cluster.log_tails(40)}"
        ) from None
    depths = {topic: _drained(run, topic) for topic in run.topics}
    requests = run.cluster.sink_requests() if run.with_topics else []
    if run.cluster.kafka is not None:
        requests += _kafka_requests(run.cluster.kafka.bootstrap, KAFKA_TARGET)
    if run.cluster.amqp is not None:
        requests += asyncio.run(_amqp_requests(run.cluster.amqp.url, AMQP_QUEUE))
    tables = json.loads(run.cli("table", "list", "--json").stdout)
    grants = json.loads(run.cli("acl", "list", "--json").stdout)
    inspected = json.loads(run.cli("workers", "inspect", "--json").stdout)
    lake = _lake_state(run) if run.with_spark else {}
    if run.with_spark:
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
            for namespace in run.cluster.warehouse.iterdir()
            if namespace.is_dir()
            for table in namespace.iterdir()
            if table.is_dir()
        ),
        "folder_makers": _folder_makers(run.cluster.warehouse),
        "topic_depths": depths,
        "lock_log": asyncio.run(run.sql("lock_log")),
        "catalog_log": asyncio.run(run.sql("catalog_log")),
        "catalog_events": asyncio.run(run.sql("catalog_events")),
        "sink_requests": requests,
        "notes": {
            notes.name.removeprefix("notes-"): notes.read_text().splitlines()
            for notes in sorted(run.cluster.root.glob("notes-*"))
        },
    }


def _lake_state(run: Run) -> dict[str, Any]:
    """Once the pipeline drained and the Spark cluster ran no driver: the bank's accounts
    in PostgreSQL and in the lake, each lake table's files on disk and in its current
    snapshot, every snapshot committed, the jobs' ledger, and the drivers still running."""
    from procbus.lakehouse import Catalog

    spark = run.cluster.spark
    assert spark is not None
    depth = _drained(run, BANK_TOPIC, timeout=300)  # a batch's apply starts a Spark session

    def active_drivers() -> list[Any]:
        with contextlib.suppress(Exception):
            return list(spark.state().get("activedrivers", []))
        return ["the master did not answer"]

    with contextlib.suppress(AssertionError):
        wait_until(lambda: not active_drivers(), 60, "no driver running", interval=1.0)

    async def read() -> dict[str, Any]:
        pool = await create_pool(run.cluster.database_url, min_size=1, max_size=2)
        try:
            queries = load_queries("procbus.testing")
            source = [dict(row) for row in await pool.fetch(queries["bank_accounts"])]
            lake = await asyncio.to_thread(
                rows_read_by_pyiceberg,
                run.cluster.database_url,
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
    pipeline = run.cli("pipeline", "status", BANK_TOPIC, "--json")
    return state | {
        "bank_depth": depth,
        "pipeline": json.loads(pipeline.stdout) if pipeline.returncode == 0 else None,
        "snapshot_log": asyncio.run(run.sql("snapshot_log")),
        "spark_jobs": asyncio.run(run.sql("spark_jobs")),
        "spark_drivers": {"active": active_drivers(), "processes": spark.drivers()},
    }


def _drained(run: Run, topic: str, timeout: float = 120) -> int:
    """The topic's depth once it is 0 (or after `timeout`): every committed event was
    delivered, or the checker says which were not."""
    depth = -1

    def empty() -> bool:
        nonlocal depth
        shown = run.cli("topic", "stats", topic, "--json")
        depth = json.loads(shown.stdout)["depth"] if shown.returncode == 0 else -1
        return depth == 0

    with contextlib.suppress(AssertionError):
        wait_until(empty, timeout, f"{topic} drained", interval=1.0)
    return depth


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
    from procbus.delivery import read_committed  # confluent-kafka loads only for the check

    try:
        records = read_committed(bootstrap, topic, None, timeout_seconds=timeout)
    except TimeoutError as error:
        raise AssertionError(str(error)) from None
    return [{"path": "/kafka", "events": [record.value]} for record in records]


def _grant_key(grant: dict[str, Any]) -> str:
    return f"{grant['principal']}:{grant['namespace']}.{grant['table']}:{grant['permission']}"


def _folder_makers(warehouse: Path) -> dict[str, str | None]:
    """Each table folder's maker (NS.TABLE -> the procedure its marker names; None: none)."""
    makers: dict[str, str | None] = {}
    for marker in warehouse.glob(f"*/*/{MARKER}"):
        with contextlib.suppress(OSError, ValueError):
            made_by = json.loads(marker.read_text()).get("created_by")
            makers[f"{marker.parent.parent.name}.{marker.parent.name}"] = made_by
    return makers


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

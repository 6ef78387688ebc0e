"""A procedure on a Temporal Schedule from Python: the hourly compaction that `procbus schedule
create` makes. Run by tests/integration/test_doc_examples.py."""

from __future__ import annotations

# --8<-- [start:schedule]
from datetime import timedelta

from temporalio.client import Client, ScheduleHandle

from procbus.lakehouse.data import CompactTableInput
from procbus.procedures.schedules import procedure_schedule
from procbus.temporal.auth import Signer


async def compact_every_hour(
    client: Client, signer: Signer, task_queue: str = "procbus"
) -> ScheduleHandle:
    """`signer`: whom the runs start as (procbus.temporal.auth.client_signer(settings) gives
    the CLI's: PROCBUS_PRINCIPAL with PROCBUS_AUTH_KEY); a production worker refuses unsigned
    runs, and checks the principal's grants at every run."""
    request = CompactTableInput(table="sales.orders", partitions=["region=eu"])
    request.check()  # what the CLI checks first: a bad name raises InvalidRequest here
    runs_id = "compact-sales.orders-orders-eu"  # Temporal appends each run's time
    return await client.create_schedule(
        "orders-eu",
        procedure_schedule(
            "CompactTable",
            request,
            target="sales.orders",
            workflow_id=runs_id,
            task_queue=task_queue,
            every=timedelta(hours=1),  # or: cron="0 3 * * *"
            headers=signer.schedule_headers(runs_id, "CompactTable", request),
        ),
    )


# --8<-- [end:schedule]

"""A procedure on a Temporal Schedule from Python: the hourly compaction that `procbus schedule
create` makes. Run by tests/integration/test_doc_examples.py and by the demo's table data scene."""

from __future__ import annotations

# --8<-- [start:schedule]
from datetime import timedelta

from temporalio.client import Client, ScheduleHandle

from procbus.lakehouse import CompactTableInput
from procbus.procedures import procedure_schedule
from procbus.temporal import Signer


async def compact_every_hour(
    client: Client,
    signer: Signer | None,
    task_queue: str = "procbus",
    *,
    request: CompactTableInput | None = None,  # default: sales.orders' partition region=eu
    schedule_id: str = "orders-eu",
    note: str | None = None,  # shown with its state (`procbus schedule describe`, the UI)
) -> ScheduleHandle:
    """`signer`: whom the runs start as (procbus.temporal.auth.client_signer(settings) gives
    the CLI's: PROCBUS_PRINCIPAL with PROCBUS_AUTH_KEY); a production worker refuses unsigned
    runs (no signer), and checks the principal's grants at every run."""
    request = request or CompactTableInput(table="sales.orders", partitions=["region=eu"])
    request.check()  # what the CLI checks first: a bad name raises InvalidRequest here
    runs_id = f"compact-{request.table}-{schedule_id}"  # Temporal appends each run's time
    return await client.create_schedule(
        schedule_id,
        procedure_schedule(
            "CompactTable",
            request,
            target=request.table,
            workflow_id=runs_id,
            task_queue=task_queue,
            every=timedelta(hours=1),  # or: cron="0 3 * * *"
            note=note,
            headers=signer.schedule_headers(runs_id, "CompactTable", request) if signer else None,
        ),
    )


# --8<-- [end:schedule]

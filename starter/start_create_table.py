"""Start a CreateTable procedure from Python and wait for it.

    python -m procbus.starter.start_create_table NS.TABLE 'id:bigint,dt:date' [--partition-by dt]

A failed step rolls everything back; the error then says which step failed and why.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid

from temporalio.common import WorkflowIDConflictPolicy

from procbus.lakehouse import CreateTableInput, TableResult
from procbus.starter.scripts import connect
from procbus.workflows import CreateTable


async def main(request: CreateTableInput, procedure_id: str) -> TableResult:
    client, services = await connect()
    return await client.execute_workflow(
        CreateTable.run,
        request,
        id=procedure_id,  # the procedure ID: the same ID never starts a second run
        task_queue=services.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"CreateTable {request.table}",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("table")
    parser.add_argument("columns")
    parser.add_argument("--partition-by", action="append", default=[])
    parser.add_argument("--id")
    args = parser.parse_args()
    request = CreateTableInput(
        table=args.table, columns=args.columns, partition_by=args.partition_by
    )
    procedure_id = args.id or f"CreateTable-{args.table}-{uuid.uuid4().hex[:8]}"
    print(asyncio.run(main(request, procedure_id)).model_dump_json(indent=2), flush=True)
    os._exit(0)  # skip interpreter shutdown, which can abort after a client (sdk-python #300)

"""Start a LoadTable procedure from Python and wait for it.

python -m procbus.starter.start_load_table NAMESPACE.TABLE SOURCE [csv|json|parquet] [PROCEDURE_ID]
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from temporalio.common import WorkflowIDConflictPolicy

from procbus.lakehouse import DataResult, InputFormat, LoadTableInput
from procbus.starter.scripts import connect
from procbus.workflows import LoadTable


async def main(target: str, source: str, input_format: str, procedure_id: str) -> DataResult:
    client, services = await connect()
    return await client.execute_workflow(
        LoadTable.run,
        LoadTableInput(table=target, source=source, format=InputFormat(input_format)),
        id=procedure_id,  # the procedure ID: the same ID never loads twice
        task_queue=services.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


if __name__ == "__main__":
    target, source = sys.argv[1], str(Path(sys.argv[2]).resolve())
    input_format = sys.argv[3] if len(sys.argv) > 3 else "csv"
    procedure_id = (
        sys.argv[4] if len(sys.argv) > 4 else f"LoadTable-{target}-{uuid.uuid4().hex[:8]}"
    )
    result = asyncio.run(main(target, source, input_format, procedure_id))
    print(result.model_dump_json(indent=2), flush=True)
    os._exit(0)  # skip interpreter shutdown, which can abort after a client (sdk-python #300)

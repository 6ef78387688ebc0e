"""Start PublishDailyTotals for a day and wait for its result.

python -m starter DAY ORDERS_CSV REPORTS_FOLDER [--id PROCEDURE_ID]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from codec import PAYLOAD_CODEC
from temporalio.client import WorkflowFailureError
from workflows.daily_totals import DailyTotalsInput, PublishDailyTotals

import procbus
from procbus import ProcbusPlugin, Settings
from worker import TASK_QUEUE


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="starter", description=__doc__.splitlines()[0])
    parser.add_argument("day")
    parser.add_argument("orders", type=Path)
    parser.add_argument("reports", type=Path)
    parser.add_argument("--id", default=None, help="the procedure ID (default: totals-DAY)")
    args = parser.parse_args(argv)
    settings = Settings(payload_codec=PAYLOAD_CODEC)  # its input and result, encoded
    client = await procbus.connect(settings, plugins=[ProcbusPlugin(settings)])
    request = DailyTotalsInput(
        day=args.day, orders=str(args.orders.absolute()), reports=str(args.reports.absolute())
    )
    try:
        result = await client.execute_workflow(
            PublishDailyTotals.run,
            request,
            id=args.id or f"totals-{args.day}",
            task_queue=TASK_QUEUE,
        )
    except WorkflowFailureError as failure:
        # The procedure rolled back: its error says which step failed and why.
        print(f"rolled back: {failure.cause}", file=sys.stderr)
        return 1
    print(result.model_dump_json())
    return 0


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1:]))
    # A process that used a Temporal client can abort while the interpreter shuts down
    # (temporalio sdk-python #300, "PyGILState_Release"): leave with the result's code instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

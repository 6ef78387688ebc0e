"""The application's worker: its procedures and activities, with procbus's plugin and its codec.

python -m worker        (Temporal's own TEMPORAL_* settings or temporal.toml profile, or
                         PROCBUS_* ones, say where Temporal is; PROCBUS_DATABASE_URL where
                         PostgreSQL is; with none, the running `procbus dev` stack)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from activities.totals import TotalsActivities, compute_totals, create_schema, discard_totals
from codec import PAYLOAD_CODEC
from temporalio.worker import Worker
from workflows.daily_totals import PublishDailyTotals

import procbus
from procbus import ProcbusPlugin, Settings
from procbus.db import create_pool
from procbus.stack import resolve_database_url

TASK_QUEUE = os.environ.get("SALES_TASK_QUEUE", "sales-reports")


async def main() -> None:
    settings = Settings(payload_codec=PAYLOAD_CODEC)
    pool = await create_pool(resolve_database_url(settings))
    try:
        await create_schema(pool)
        # The plugin brings procbus's converter, interceptors, lock and bus activities, the
        # worker's bus membership, the outbox relay and the Spark session of `compute_totals`;
        # the client encodes every payload, procbus's too, with the application's codec.
        plugin = ProcbusPlugin(settings, pool=pool)
        client = await procbus.connect(settings, plugins=[plugin])
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[PublishDailyTotals],
            activities=[compute_totals, discard_totals, TotalsActivities(pool).publish_totals],
        )
        stop = asyncio.Event()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signal_number, stop.set)
        async with worker:
            print(f"worker on task queue {TASK_QUEUE!r}, stop with Ctrl-C", flush=True)
            await stop.wait()
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
    # A process that ran a Temporal worker can abort while the interpreter shuts down
    # (temporalio sdk-python #300, "PyGILState_Release"): leave cleanly once it has stopped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

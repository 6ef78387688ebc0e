"""What the procedure engine costs: 5-step procedures against plain 5-activity workflows.

N procedures (undo registered for every step, search attributes kept current, status kept) and
N plain workflows with the same 5 no-op activities, C at a time, on the same Temporal server in
the same run. Goal: procedure wall time <= 1.3x plain. Last line: JSON.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import uuid
from collections.abc import Awaitable

from harness import bench_services, emit, sized  # bench/, beside this script
from lanes import timed
from overhead_workflows import FiveSteps, Plain, PlainInput, noop, undo_noop
from temporalio.worker import Worker

from procbus.engine.runner import workflow_runner
from procbus.procedures import ProcedureInput
from procbus.temporal import connect_client

COUNT = sized(200, 2, "BENCH_COUNT")
CONCURRENCY = sized(50, 2, "BENCH_CONCURRENCY")
ROUNDS = sized(2, 1, "BENCH_ROUNDS")
FIGURES = (
    "count",
    "concurrency",
    "steps",
    "plain_seconds",
    "procedure_seconds",
    "plain_workflows_per_s",
    "procedures_per_s",
    "ratio_procedure_to_plain",
    "goal_ratio_at_most",
)


async def main() -> dict[str, float | int]:
    async with bench_services() as services:
        client = await connect_client(services.temporal_address, "default")
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Plain, FiveSteps],
            workflow_runner=workflow_runner(),
            activities=[noop, undo_noop],
            max_concurrent_workflow_tasks=CONCURRENCY,
            max_concurrent_activities=CONCURRENCY,
        ):

            def start_plain(i: int, r: int) -> Awaitable[object]:
                return client.execute_workflow(
                    Plain.run, PlainInput(), id=f"plain-{r}-{i}-{queue}", task_queue=queue
                )

            def start_procedure(i: int, r: int) -> Awaitable[object]:
                return client.execute_workflow(
                    FiveSteps.run,
                    ProcedureInput(),
                    id=f"procedure-{r}-{i}-{queue}",
                    task_queue=queue,
                )

            plain_times: list[float] = []
            procedure_times: list[float] = []
            # Alternate the two sides so warm-up and server state favour neither.
            for round_number in range(ROUNDS):
                plain_times.append(
                    await timed(COUNT, CONCURRENCY, functools.partial(start_plain, r=round_number))
                )
                procedure_times.append(
                    await timed(
                        COUNT, CONCURRENCY, functools.partial(start_procedure, r=round_number)
                    )
                )
    plain = min(plain_times)
    procedure = min(procedure_times)
    return {
        "count": COUNT,
        "concurrency": CONCURRENCY,
        "steps": 5,
        "plain_seconds": round(plain, 2),
        "procedure_seconds": round(procedure, 2),
        "plain_workflows_per_s": round(COUNT / plain, 1),
        "procedures_per_s": round(COUNT / procedure, 1),
        "ratio_procedure_to_plain": round(procedure / plain, 3),
        "goal_ratio_at_most": 1.3,
    }


if __name__ == "__main__":
    figures = asyncio.run(main())
    print(f"plain workflows:  {figures['plain_seconds']} s for {COUNT}")
    print(f"procedures:       {figures['procedure_seconds']} s for {COUNT}")
    emit(figures, FIGURES)
    sys.stderr.flush()
    os._exit(0)  # temporalio sdk-python #300

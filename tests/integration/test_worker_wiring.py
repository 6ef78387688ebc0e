"""`procbus worker` does what `procbus dev` does: workflows, activities, the relay loop and the
sweep Schedule, so a worker started by docker-compose sweeps too."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client, ScheduleActionStartWorkflow
from temporalio.service import RPCError

from procbus.hooks.outbox import SWEEP_EVERY, SWEEP_SCHEDULE_ID, ensure_sweep_schedule
from tests.services import subprocess_environment, worker_process


async def test_procbus_worker_creates_the_sweep_schedule_once(
    client: Client, temporal_address: str, database_url: str, task_queue: str, state_dir: Path
) -> None:
    schedule = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
    with contextlib.suppress(RPCError):  # left by another test on this shared server
        await schedule.delete()
    env = subprocess_environment(
        state_dir,
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
    )
    try:
        with worker_process(env) as first:
            async with asyncio.timeout(60):
                while True:
                    try:
                        description = await schedule.describe()
                        break
                    except RPCError:
                        assert first.poll() is None, "procbus worker exited"
                        await asyncio.sleep(0.2)
            action = description.schedule.action
            assert isinstance(action, ScheduleActionStartWorkflow)
            assert action.workflow == "OutboxSweep"
            assert action.task_queue == task_queue
            # Hourly: the relay loops sweep all the time, the UI list is not flooded.
            intervals = description.schedule.spec.intervals
            assert [interval.every for interval in intervals] == [SWEEP_EVERY]
            # A second worker finds it there and goes on: creating it is idempotent.
            with worker_process(env) as second:
                await asyncio.sleep(5)
                assert second.poll() is None, "a second procbus worker failed to start"
            assert first.poll() is None
            again = await schedule.describe()
            assert again.info.created_at == description.info.created_at  # not made anew
    finally:
        with contextlib.suppress(RPCError):
            await schedule.delete()


async def test_a_sweep_schedule_of_every_minute_becomes_hourly(
    client: Client, task_queue: str
) -> None:
    schedule = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
    with contextlib.suppress(RPCError):
        await schedule.delete()
    try:
        await ensure_sweep_schedule(client, task_queue, every=timedelta(minutes=1))  # as before
        await ensure_sweep_schedule(client, task_queue)
        description = await schedule.describe()
        assert [i.every for i in description.schedule.spec.intervals] == [timedelta(hours=1)]
        action = description.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow) and action.task_queue == task_queue
    finally:
        with contextlib.suppress(RPCError):
            await schedule.delete()


async def test_a_sweep_schedule_of_another_task_queue_moves_to_this_one(
    client: Client, task_queue: str
) -> None:
    schedule = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
    with contextlib.suppress(RPCError):
        await schedule.delete()
    try:
        await ensure_sweep_schedule(client, f"{task_queue}-old")  # workers that moved on since
        await ensure_sweep_schedule(client, task_queue)
        action = (await schedule.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow) and action.task_queue == task_queue
    finally:
        with contextlib.suppress(RPCError):
            await schedule.delete()

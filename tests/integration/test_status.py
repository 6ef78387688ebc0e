from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

from temporalio.worker import Worker

from procbus.config import load_settings
from procbus.stack.status import check_status


async def test_status_is_up_with_a_worker(
    temporal_address: str, database_url: str, task_queue: str, worker: Worker, tmp_path: Path
) -> None:
    settings = load_settings(
        temporal_address=temporal_address,
        # The embedded server's password is in the URL; it must never be shown.
        database_url=database_url,
        task_queue=task_queue,
        state_dir=tmp_path,
    )
    # Temporal lists a poller once its first poll has reached the server.
    for _ in range(50):
        status = await check_status(settings)
        if status.up:
            break
        await asyncio.sleep(0.2)
    assert {c.name: c.up for c in status.components} == {
        "temporal": True,
        "postgresql": True,
        "worker": True,
    }, status.components
    assert status.up
    password = urlsplit(database_url).password
    assert password and status.database_url is not None
    assert password not in status.database_url and ":***@" in status.database_url


async def test_status_is_down_without_a_worker(
    temporal_address: str, database_url: str, task_queue: str, tmp_path: Path
) -> None:
    settings = load_settings(
        temporal_address=temporal_address,
        database_url=database_url,
        task_queue=task_queue,
        state_dir=tmp_path,
    )
    status = await check_status(settings)
    worker = next(c for c in status.components if c.name == "worker")
    assert not status.up
    assert not worker.up
    assert task_queue in worker.detail


async def test_status_reports_an_unreachable_database(
    temporal_address: str, task_queue: str, tmp_path: Path
) -> None:
    from procbus.stack.processes import free_port

    settings = load_settings(
        temporal_address=temporal_address,
        database_url=f"postgresql://app@127.0.0.1:{free_port()}/none",
        task_queue=task_queue,
        state_dir=tmp_path,
    )
    status = await check_status(settings)
    database = next(c for c in status.components if c.name == "postgresql")
    assert not database.up
    assert "unreachable" in database.detail

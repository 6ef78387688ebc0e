"""Records the histories that tests/unit/test_histories.py replays: a pytest plugin that, after
each test it runs, saves the history of every workflow that test started and that ended.

`make record-histories` runs the tests it lists with `-p tests.histories.recorder`: run it when a
change to a procedure is meant to change what it does, after making the change replay-safe for
procedures in flight (docs/how-to/upgrading.md). Each test's histories go to a folder of its own
under tests/histories/, replacing what was there.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

HISTORIES = Path(__file__).parent
# Visibility is a moment behind the history: a workflow that just ended may still list as running.
SETTLE_SECONDS = 1.0


@pytest.fixture(autouse=True)
async def _record_histories(request: pytest.FixtureRequest, client: Client) -> AsyncIterator[None]:
    started = datetime.now(UTC) - timedelta(seconds=1)
    yield
    await asyncio.sleep(SETTLE_SECONDS)
    test = request.node.nodeid.split("@")[0]
    # One folder a test, a parametrized test's cases each their own.
    case = request.node.name.split("@")[0]
    folder = HISTORIES / f"{Path(test.split('::')[0]).stem}--{case}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    query = f'StartTime >= "{started.isoformat()}" AND ExecutionStatus != "Running"'
    executions = [execution async for execution in client.list_workflows(query)]
    executions.sort(key=lambda execution: (execution.start_time, execution.id))
    for number, execution in enumerate(executions, start=1):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        recorded = {
            "workflow_id": execution.id,
            "workflow_type": execution.workflow_type,
            "recorded_by": test,
            "history": history.to_json_dict(),
        }
        path = folder / f"{number:02d}-{execution.workflow_type}.json"
        path.write_text(json.dumps(recorded, sort_keys=True) + "\n")

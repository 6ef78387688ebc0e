"""Procedures in flight survive an upgrade: every history recorded in tests/histories/ (by
`make record-histories`) replays against today's workflow code without a nondeterminism error.

A procedure can wait STUCK for an operator for days; the worker that picks it up again may run
newer code, which must make the same decisions for the events already in its history. A change
that would not (a step renamed, added or moved without `workflow.patched`) fails here; see
docs/how-to/upgrading.md for how to make it safely.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from procbus.engine.runner import workflow_runner
from procbus.temporal.payloads import procbus_data_converter
from procbus.worker.main import WORKFLOWS, worker_interceptors
from tests.integration.ledger_procedures import Ledger, RollForwardLedger, ShortHistoryLedger

HISTORIES = Path(__file__).parents[1] / "histories"
RECORDED = sorted(HISTORIES.glob("*/*.json"))
# The built-in procedures and engine paths the recordings must cover (the engine's own paths run
# on its test procedure, Ledger: STUCK, retry, skip, children, continue-as-new).
BUILT_IN_PROCEDURES = {
    "CreateNamespace",
    "CreateTable",
    "DeleteTable",
    "DeleteNamespace",
    "LoadTable",
    "CompactTable",
    "ChangeAccess",
    "Broadcast",
    "StackCheck",
}


def recorded(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def replayer() -> Replayer:
    """As the worker runs them: the same workflows, sandbox, payloads and interceptors."""
    return Replayer(
        workflows=[*WORKFLOWS, Ledger, RollForwardLedger, ShortHistoryLedger],
        workflow_runner=workflow_runner(),
        data_converter=procbus_data_converter,
        interceptors=worker_interceptors(),
    )


def test_the_recordings_cover_every_built_in_procedure_and_the_engines_paths() -> None:
    types = {recorded(path)["workflow_type"] for path in RECORDED}
    missing = BUILT_IN_PROCEDURES - types
    assert not missing, f"no recorded history of {sorted(missing)}: add a test to HISTORY_TESTS"
    tests = {path.parent.name for path in RECORDED}
    for path in ("stuck", "retry", "skip", "children", "continue_as_new"):
        assert any(path in test for test in tests), (path, sorted(tests))


async def test_every_recorded_history_replays_on_todays_code() -> None:
    assert RECORDED, f"no recorded histories in {HISTORIES}: run `make record-histories`"
    recordings = {path: recorded(path) for path in RECORDED}
    by_run: dict[str, Path] = {}

    async def histories() -> AsyncIterator[WorkflowHistory]:
        for path, recording in recordings.items():
            history = WorkflowHistory.from_json(recording["workflow_id"], recording["history"])
            by_run[history.run_id] = path
            yield history

    # One replaying worker for all of them, as a worker after an upgrade meets them.
    results = await replayer().replay_workflows(histories(), raise_on_replay_failure=False)
    failed = {
        f"{by_run[run_id].parent.name}/{by_run[run_id].name}": str(error)
        for run_id, error in results.replay_failures.items()
    }
    assert not failed, f"{len(failed)} of {len(RECORDED)} no longer replay: {failed}"

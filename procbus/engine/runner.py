"""The workflow sandbox procbus's workers run in: Temporal's, with procbus's library passed through.

The sandbox imports a workflow's module afresh for every run, and with it every module that
module imports unless it is passed through. Without this, each procedure run executed the
engine (procbus/engine/, 1,500 lines) again: about half of a worker's CPU in the engine's own
tests. procbus is library code, deterministic to import and tested as such, so it is imported
once, as Temporal's sandbox guide advises for such modules (a user's `from procbus import
Procedure` included); a procedure's own module (its steps) still runs in the sandbox with its
restrictions, procbus's built-in procedures (procbus.workflows) as much as a user's.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from pathlib import Path

from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

# The sandbox passes a module through with every module under it, so procbus's own built-in
# procedures (procbus.workflows) are kept out by naming the library's packages one by one: they
# are procedure modules like a user's, run in the sandbox with its restrictions.
SANDBOXED = frozenset({"workflows"})
LIBRARY_PACKAGES = tuple(
    f"procbus.{module.name}"
    for module in pkgutil.iter_modules([str(Path(__file__).parents[1])])
    if module.name not in SANDBOXED
)
# asyncpg: its compiled protocol crashes the process (a segfault in its next connect) once the
# sandbox has imported it a second time.
PASSED_THROUGH = (*LIBRARY_PACKAGES, "asyncpg")


def workflow_runner() -> SandboxedWorkflowRunner:
    """Return Temporal's sandbox runner, with its default restrictions and procbus imported once."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH)
    )


def procbus_runner(runner: WorkflowRunner | None) -> WorkflowRunner:
    """Return `runner` with procbus imported once: a user's own sandbox, restrictions kept.

    A sandboxed runner gets procbus's passthrough modules added to its restrictions; any other
    (Temporal's UnsandboxedWorkflowRunner, a runner of the user's own) is returned as it is.

    Args:
        runner: the worker's runner so far; procbus's sandbox runner when None.
    """
    if runner is None:
        return workflow_runner()
    if isinstance(runner, SandboxedWorkflowRunner):
        return dataclasses.replace(
            runner, restrictions=runner.restrictions.with_passthrough_modules(*PASSED_THROUGH)
        )
    return runner

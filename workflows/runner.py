"""The workflow sandbox procbus's workers run in: Temporal's, with the engine passed through.

The sandbox imports a workflow's module afresh for every run, and with it every module that
module imports unless it is passed through. Without this, each procedure run executed the
engine (workflows/procedure.py and the three modules it uses, 1,500 lines) again: about half
of a worker's CPU in the engine's own tests. The engine is library code, deterministic and
tested as such, so it is imported once, as Temporal's sandbox guide advises for such modules;
a procedure's own module (its steps) still runs in the sandbox with its restrictions.
"""

from __future__ import annotations

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

ENGINE_MODULES = (
    "workflows.procedure",
    "workflows.bus",
    "workflows.children",
    "workflows.locks",
)


def workflow_runner() -> SandboxedWorkflowRunner:
    """Temporal's sandbox, with its default restrictions, and the engine imported once."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*ENGINE_MODULES)
    )

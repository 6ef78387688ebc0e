"""procbus: safe multi-step, multi-system operations for data platforms, on Temporal.

What a user's own code needs is imported from here:

    from procbus import Procedure, ProcbusPlugin, ProcedureInput, invalid_input, spark_job, step_key

with the step helpers in their mechanisms (`procbus.hooks` and `procbus.topics` to publish in a
step's transaction, `procbus.bus.models` for what a broadcast tells every worker), and a
Temporal client connected as the `procbus` CLI connects (the same settings; the running
`procbus dev` when none names a server): `await connect(plugins=[ProcbusPlugin(Settings())])`.

procbus's own application (its built-in procedures, activities, worker and CLI) installs under
this namespace too, as procbus.workflows, procbus.activities, procbus.worker and procbus.starter
(the repository keeps them in top-level folders, linked here), so it never shadows a user's own
`workflows` or `activities` package.

One package per mechanism, in layers (docs/internals/layout.md; import-linter keeps them): core
and errors at the bottom; the mechanisms (db, batching, locks, topics, procedures, lakehouse,
auth, bus, spark) above them; the integrations (capture, delivery, pipeline, retention, hooks)
above those; the settings (config), the Temporal adapter (temporal), the procedure engine
(engine) and the embedded stack (stack) on top, and the Temporal plugin (plugin) above all.
The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.config import Settings as Settings
    from procbus.engine import Procedure as Procedure
    from procbus.engine import invalid_input as invalid_input
    from procbus.engine import workflow_runner as workflow_runner
    from procbus.plugin import ProcbusPlugin as ProcbusPlugin
    from procbus.plugin import spark_job as spark_job
    from procbus.procedures import ProcedureInput as ProcedureInput
    from procbus.procedures import step_key as step_key
    from procbus.stack import connect as connect

# Public name -> the module that defines it.
_PUBLIC = {
    "Procedure": "procbus.engine.procedure",
    "invalid_input": "procbus.engine.procedure",
    "workflow_runner": "procbus.engine.runner",
    "ProcbusPlugin": "procbus.plugin.extension",
    "spark_job": "procbus.plugin.spark",
    "step_key": "procbus.procedures",
    "ProcedureInput": "procbus.procedures",
    "Settings": "procbus.config",
    "connect": "procbus.stack.connect",
}

__all__ = [
    "ProcbusPlugin",
    "Procedure",
    "ProcedureInput",
    "Settings",
    "connect",
    "invalid_input",
    "spark_job",
    "step_key",
    "workflow_runner",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'procbus' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""Users' own procedures on `procbus worker`: modules named by `--workflows` or by the
`procbus.workflows` entry-point group of an installed package.

From each module the worker takes the workflow classes it defines (`@workflow.defn`), the
activity functions it defines (`@activity.defn`) and whatever else it lists in `ACTIVITIES`
(bound methods of activity objects it builds). Modules are imported with the working folder on
the import path, so a project's own packages load when the worker runs from its folder. A module
that does not import, that defines no workflow, or whose workflow is named like a built-in one
(or like another module's) stops the worker before it starts, with one line that says which.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType

from procbus.core import is_activity, workflow_definition
from procbus.errors import ConfigError

ENTRY_POINT_GROUP = "procbus.workflows"


@dataclass
class UserProcedures:
    modules: list[str] = field(default_factory=list)
    workflows: list[type] = field(default_factory=list)
    activities: list[Callable[..., object]] = field(default_factory=list)


def workflow_name(cls: type) -> str | None:
    definition = workflow_definition(cls)
    return definition.name if definition is not None else None


def entry_point_modules() -> list[str]:
    """The modules installed packages declare under `procbus.workflows`."""
    return [entry.value for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]


def _import(name: str) -> ModuleType:
    # As `python -m` and other workers' CLIs do: the user's project, run from its folder.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except Exception as error:  # any failure of the user's module is reported the same way
        raise ConfigError(
            f"--workflows {name}: the module does not import: {type(error).__name__}: {error}"
        ) from None


def _defined_here(module: ModuleType) -> Iterable[object]:
    for value in vars(module).values():
        if getattr(value, "__module__", None) == module.__name__:
            yield value


def load_user_procedures(names: Sequence[str], built_in: Sequence[type]) -> UserProcedures:
    """The workflows and activities of the modules `names` (in order, each once)."""
    taken = {workflow_name(cls): "procbus" for cls in built_in}
    found = UserProcedures()
    for name in dict.fromkeys(names):
        module = _import(name)
        workflows = [
            value
            for value in _defined_here(module)
            if inspect.isclass(value) and workflow_name(value) is not None
        ]
        if not workflows:
            raise ConfigError(
                f"--workflows {name}: the module defines no workflow (no @workflow.defn class)"
            )
        for cls in workflows:
            type_name = workflow_name(cls)
            owner = taken.get(type_name)
            if owner is not None:
                where = "a built-in procedure" if owner == "procbus" else f"one in {owner}"
                raise ConfigError(
                    f"--workflows {name}: workflow {type_name!r} ({cls.__qualname__}) has the "
                    f"name of {where}: give it another name in @workflow.defn(name=...)"
                )
            taken[type_name] = name
        functions = [
            value
            for value in _defined_here(module)
            if callable(value) and not inspect.isclass(value) and is_activity(value)
        ]
        listed = list(getattr(module, "ACTIVITIES", []))
        found.modules.append(name)
        found.workflows.extend(workflows)
        found.activities.extend([*functions, *listed])
    return found

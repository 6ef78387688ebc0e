"""procbus's public surface: what a user's code imports from the top level, pinned (as
temporalio's own tests pin `temporalio.workflow`'s), each name resolving to what it says, and
every package's `__all__` naming only what it has."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import procbus

# A change to this list is a change to procbus's public API: the docs (how-to/own-procedure.md,
# the README) and the user project's example import these.
TOP_LEVEL = [
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

PACKAGES = sorted(
    f"procbus.{module.name}"
    for module in pkgutil.iter_modules([str(Path(procbus.__file__).parent)])
    if module.ispkg
)


def test_the_top_level_exports_are_pinned() -> None:
    assert sorted(procbus.__all__) == sorted(TOP_LEVEL)


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_each_top_level_name_is_the_object_its_module_defines(name: str) -> None:
    exported = getattr(procbus, name)
    assert exported is getattr(importlib.import_module(exported.__module__), name)
    assert exported.__module__.startswith("procbus."), exported.__module__


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Procedures'"):
        _ = procbus.Procedures  # type: ignore[attr-defined]


def test_a_star_import_gives_the_exports_and_importing_procbus_stays_light() -> None:
    """The names load on first use: `import procbus` loads neither temporalio's client nor
    pyspark (each command pays only for what it uses)."""
    code = (
        "import sys\n"
        "import procbus\n"
        "heavy = [m for m in ('temporalio.client', 'pyspark', 'asyncpg') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from procbus import *\n"
        f"assert sorted(n for n in {TOP_LEVEL!r} if n in globals()) == sorted({TOP_LEVEL!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_a_packages_all_resolves(package: str) -> None:
    module = importlib.import_module(package)
    names = getattr(module, "__all__", [])
    assert len(set(names)) == len(names), f"{package}.__all__ names one twice"
    missing = [name for name in names if not hasattr(module, name)]
    assert missing == [], f"{package}.__all__ names what it lacks"

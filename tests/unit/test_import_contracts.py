"""The import contracts (pyproject.toml, [tool.importlinter]) hold, and the CLI stays light."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
APPLICATION = ("workflows", "activities", "worker", "starter")


def test_the_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [str(BIN / "lint-imports")], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_help_imports_neither_temporal_nor_the_database_driver() -> None:
    """`procbus --help` and every command's --help pay only for typer and rich."""
    probe = (
        "import sys\n"
        "from procbus.starter.cli import app\n"
        "heavy = sorted({name.split('.')[0] for name in sys.modules}"
        " & {'temporalio', 'asyncpg', 'pyspark', 'pydantic_settings'})\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_a_worker_starts_without_spark_or_pyiceberg() -> None:
    """A worker, or a command that reads the catalog, loads pyiceberg and pyspark only when it
    reads or writes a table's files: a worker (re)started by a test or a nemesis pays nothing."""
    probe = (
        "import sys\n"
        "import procbus.worker, procbus.lakehouse.catalog, procbus.pipeline\n"
        "heavy = sorted({name.split('.')[0] for name in sys.modules} & {'pyiceberg', 'pyspark'})\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_a_user_imports_everything_from_procbus_and_pays_only_for_what_it_uses() -> None:
    probe = (
        "import sys\n"
        "import procbus\n"
        "assert 'temporalio' not in sys.modules, 'import procbus loaded Temporal'\n"
        "from procbus import Procedure, ProcedureInput, invalid_input, step_key, workflow_runner\n"
        "from procbus.engine.procedure import Procedure as engine_procedure\n"
        "assert Procedure is engine_procedure\n"
        "print(sorted(procbus.__all__))\n"
        "try:\n"
        "    procbus.Procedures\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    names, missing = result.stdout.splitlines()
    assert "'Procedure'" in names and "'step_key'" in names
    assert missing == "module 'procbus' has no attribute 'Procedures'"


def test_nothing_imports_the_application_by_its_folder_name() -> None:
    """The application installs as procbus.workflows, .activities, .worker and .starter: a
    top-level `import workflows` would find a user's package of that name (or none at all)."""
    folder_import = re.compile(r"^\s*(from|import) (workflows|activities|worker|starter)\b", re.M)
    found = [
        f"{path.relative_to(PROJECT)}: {match.group(0).strip()}"
        for folder in (*APPLICATION, "procbus", "tests", "bench", "examples", "docs")
        for path in (PROJECT / folder).rglob("*.py")
        # The user project imports its own `workflows` and `activities`, as users do.
        if "histories" not in path.parts and "user-project" not in path.parts
        for match in folder_import.finditer(path.read_text())
    ]
    assert found == []

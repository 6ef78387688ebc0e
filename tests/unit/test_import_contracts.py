"""The import contracts (pyproject.toml, [tool.importlinter]) hold, and the CLI stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [str(BIN / "lint-imports")], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_help_imports_neither_temporal_nor_the_database_driver() -> None:
    """`procbus --help` and every command's --help pay only for typer and rich."""
    probe = (
        "import sys\n"
        "from starter.cli import app\n"
        "heavy = sorted({name.split('.')[0] for name in sys.modules}"
        " & {'temporalio', 'asyncpg', 'pyspark', 'pydantic_settings'})\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""

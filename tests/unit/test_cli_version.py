"""`procbus --version` says the installed distribution's version."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from procbus.starter.cli import app


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert (result.exit_code, result.output) == (0, f"procbus {version('procbus')}\n")

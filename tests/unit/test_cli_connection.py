"""The CLI's Temporal-only commands on a Temporal configured alone: no database URL asked for."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from procbus.errors import StackError
from procbus.stack.processes import free_port
from procbus.starter.cli import app

# No procbus or Temporal setting, profile or dev stack of the machine running the tests.
pytestmark = pytest.mark.usefixtures("no_configured_services")


@pytest.mark.parametrize("variable", ["PROCBUS_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"])
@pytest.mark.parametrize("command", [["proc", "list"], ["proc", "status", "p-1"]])
def test_a_status_read_goes_to_the_configured_temporal_without_a_database_url(
    monkeypatch: pytest.MonkeyPatch, variable: str, command: list[str]
) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens: the error says where it went
    monkeypatch.setenv(variable, address)
    result = CliRunner().invoke(app, command)
    assert isinstance(result.exception, StackError), result.output
    assert f"cannot reach the Temporal server at {address}" in str(result.exception)

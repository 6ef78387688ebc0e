"""`procbus.connect()`: a client on the Temporal the CLI would use, with procbus's payloads."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import Client

import procbus
from procbus.errors import ConfigError, StackError
from procbus.stack.processes import free_port
from procbus.temporal import ProcbusPayloadConverter

# No procbus or Temporal setting, profile or dev stack of the machine running the tests.
pytestmark = pytest.mark.usefixtures("no_configured_services")


async def test_it_connects_where_the_settings_say_with_procbus_payloads_and_the_plugins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: dict[str, Any] = {}

    async def connect(address: str, **options: Any) -> str:
        asked.update(options, address=address)
        return "client"

    monkeypatch.setattr(Client, "connect", connect)
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("PROCBUS_TEMPORAL_NAMESPACE", "orders")
    plugin = procbus.ProcbusPlugin(procbus.Settings(database_url="postgresql://localhost/p"))
    assert await procbus.connect(plugins=[plugin]) == "client"
    assert asked["address"] == "temporal.internal:7233"
    assert asked["namespace"] == "orders"
    assert list(asked["plugins"]) == [plugin]
    assert issubclass(asked["data_converter"].payload_converter_class, ProcbusPayloadConverter)
    assert asked["interceptors"] == []  # no principal: it signs nothing


async def test_an_unreachable_server_is_one_line_naming_it() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens
    with pytest.raises(StackError, match=f"cannot reach the Temporal server at {address}"):
        await procbus.connect(procbus.Settings(temporal_address=address))


async def test_without_a_server_or_a_dev_stack_it_says_what_to_set() -> None:
    with pytest.raises(StackError, match="no embedded stack runs.*PROCBUS_TEMPORAL_ADDRESS"):
        await procbus.connect()


async def test_a_principal_needs_a_key_to_sign_with() -> None:
    settings = procbus.Settings(temporal_address="127.0.0.1:7233")
    with pytest.raises(ConfigError, match="cannot start as 'alice': no key to sign with"):
        await procbus.connect(settings, principal="alice")

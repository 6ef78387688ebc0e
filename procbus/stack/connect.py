"""`procbus.connect()`: a Temporal client on the namespace procbus's CLI would use.

    client = await procbus.connect(plugins=[ProcbusPlugin(settings)])

The address, namespace, TLS and API key come from the same place as for every `procbus`
command (PROCBUS_TEMPORAL_*, Temporal's TEMPORAL_* and temporal.toml profile, else the running
`procbus dev`), payloads are procbus's pydantic JSON through PROCBUS_PAYLOAD_CODEC's codec, and a
server still starting is waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from procbus.config import Settings, load_settings
from procbus.stack.addresses import resolve_temporal

if TYPE_CHECKING:
    from temporalio.client import Client, Plugin


async def connect(
    settings: Settings | None = None,
    *,
    plugins: Sequence[Plugin] = (),
    principal: str | None = None,
) -> Client:
    """Connect a Temporal client configured as procbus's CLI connects its own.

    Args:
        settings: procbus's settings; read from PROCBUS_* (and .env) when None.
        plugins: Temporal plugins for the client (`ProcbusPlugin` for a worker built on it).
        principal: sign every workflow the client starts as this principal; else as
            PROCBUS_PRINCIPAL when set; else the client signs nothing.

    Raises:
        ConfigError: when a setting is bad, Temporal's configuration cannot be read, or a
            principal is named without a key to sign with.
        StackError: when nothing names a Temporal server and no `procbus dev` runs, or the
            server cannot be reached.
    """
    from procbus.temporal import client_signer, connect_client

    settings = settings or load_settings()
    services = resolve_temporal(settings)
    signer_for = principal or settings.principal
    return await connect_client(
        services.temporal_address,
        services.namespace,
        settings,
        signer=client_signer(settings, signer_for) if signer_for is not None else None,
        options=services.temporal_options,
        plugins=plugins,
    )

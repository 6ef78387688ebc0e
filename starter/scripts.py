"""What every starter script shares: a Temporal client on the configured (or running) stack,
made by the same factory as the CLI's, so TLS and API keys from the settings apply here too."""

from __future__ import annotations

from temporalio.client import Client

from procbus.config import load_settings
from procbus.stack import TemporalAddresses, resolve_temporal
from procbus.temporal import client_signer, connect_client


async def connect(principal: str | None = None) -> tuple[Client, TemporalAddresses]:
    """The client signs every start as `principal`, else PROCBUS_PRINCIPAL, else (on the dev
    stack, with its key) the dev operator. Only Temporal is needed: no database URL."""
    settings = load_settings()
    services = resolve_temporal(settings)
    signer = client_signer(settings, principal)
    client = await connect_client(
        services.temporal_address,
        services.namespace,
        settings,
        signer=signer,
        options=services.temporal_options,
    )
    return client, services

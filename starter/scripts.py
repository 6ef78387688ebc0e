"""What every starter script shares: a Temporal client on the configured (or running) stack,
made by the same factory as the CLI's, so TLS and API keys from the settings apply here too."""

from __future__ import annotations

from temporalio.client import Client

from procbus.config import load_settings
from procbus.stack.addresses import ServiceAddresses, resolve_addresses
from procbus.temporal.client import connect_client


async def connect() -> tuple[Client, ServiceAddresses]:
    settings = load_settings()
    services = resolve_addresses(settings)
    client = await connect_client(services.temporal_address, services.namespace, settings)
    return client, services

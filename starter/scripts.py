"""What every starter script shares: a Temporal client on the configured (or running) stack."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from procbus.config import load_settings
from procbus.endpoints import Endpoints, resolve_endpoints


async def connect() -> tuple[Client, Endpoints]:
    endpoints = resolve_endpoints(load_settings())
    client = await Client.connect(
        endpoints.temporal_address,
        namespace=endpoints.namespace,
        data_converter=pydantic_data_converter,  # the input models travel as JSON
    )
    return client, endpoints

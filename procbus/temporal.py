"""Temporal clients for procbus: pydantic payloads, TLS or API key from the settings."""

from __future__ import annotations

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from procbus.config import Settings
from procbus.errors import StackError


def tls_config(settings: Settings) -> TLSConfig | bool:
    if not settings.uses_tls:
        # Temporal Cloud with an API key still speaks TLS, with the system's CA roots.
        return settings.temporal_api_key is not None
    return TLSConfig(
        server_root_ca_cert=settings.temporal_tls_ca.read_bytes()
        if settings.temporal_tls_ca
        else None,
        client_cert=settings.temporal_tls_cert.read_bytes() if settings.temporal_tls_cert else None,
        client_private_key=settings.temporal_tls_key.read_bytes()
        if settings.temporal_tls_key
        else None,
    )


async def connect_client(address: str, namespace: str, settings: Settings | None = None) -> Client:
    """A client whose payloads are pydantic models as JSON, so the `temporal` CLI can send them."""
    tls: TLSConfig | bool = False
    api_key = None
    if settings is not None:
        tls = tls_config(settings)
        if settings.temporal_api_key is not None:
            api_key = settings.temporal_api_key.get_secret_value()
    try:
        return await Client.connect(
            address,
            namespace=namespace,
            tls=tls,
            api_key=api_key,
            data_converter=pydantic_data_converter,
        )
    except RuntimeError as error:  # the core SDK reports an unreachable server this way
        raise StackError(f"cannot reach the Temporal server at {address}: {error}") from None
    except RPCError as error:
        raise StackError(f"the Temporal server at {address} refused the client: {error}") from None


def workflow_ui_url(ui_url: str | None, namespace: str, workflow_id: str) -> str | None:
    return f"{ui_url}/namespaces/{namespace}/workflows/{workflow_id}" if ui_url else None

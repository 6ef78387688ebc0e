"""The client for an endpoint, by its kind."""

from __future__ import annotations

from procbus.core.endpoints import Endpoint, EndpointKind
from procbus.delivery.clients import EndpointClient
from procbus.errors import InvalidRequest


def client_for(
    endpoint: Endpoint, secrets: list[str], *, timeout_seconds: float | None = None
) -> EndpointClient:
    """The endpoint's client; `timeout_seconds` bounds each send (the client's default when
    None)."""
    timeout = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}
    if endpoint.kind is EndpointKind.WEBHOOK:
        # aiohttp loads at a worker's first webhook: ~0.15 s of CPU off every worker start.
        from procbus.delivery.webhook import WebhookClient

        return WebhookClient(endpoint, secrets, **timeout)
    if endpoint.kind is EndpointKind.AMQP:
        # aio-pika loads only for an AMQP endpoint: a webhook-only worker never pays for it.
        from procbus.delivery.amqp import AmqpClient

        return AmqpClient(endpoint, **timeout)
    raise InvalidRequest(f"no client for {endpoint.kind} endpoints")

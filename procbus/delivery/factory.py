"""The client for an endpoint, by its kind."""

from __future__ import annotations

from procbus.delivery.clients import EndpointClient
from procbus.delivery.endpoints import Endpoint, EndpointKind
from procbus.delivery.webhook import WebhookClient
from procbus.errors import InvalidRequest


def client_for(endpoint: Endpoint, secrets: list[str]) -> EndpointClient:
    if endpoint.kind is EndpointKind.WEBHOOK:
        return WebhookClient(endpoint, secrets)
    if endpoint.kind is EndpointKind.AMQP:
        from procbus.delivery.amqp import AmqpClient

        return AmqpClient(endpoint)
    raise InvalidRequest(f"no client for {endpoint.kind} endpoints")

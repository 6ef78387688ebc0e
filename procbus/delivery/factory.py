"""The client for an endpoint, by its kind."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from procbus.core import Endpoint, EndpointKind, KafkaCredentials
from procbus.delivery.clients import EndpointClient
from procbus.errors import InvalidRequest


def client_for(
    endpoint: Endpoint,
    secrets: list[str],
    *,
    timeout_seconds: float | None = None,
    topic: str = "",
    transactional: bool = False,
    allowlist: list[str] | None = None,
    kafka_credentials: Mapping[str, KafkaCredentials] | None = None,
) -> EndpointClient:
    """The endpoint's client; `timeout_seconds` bounds each send (the client's default when
    None). A Kafka client also takes the procbus topic it delivers (its transactional.id,
    `transactional` for a grouped topic), the allowlist its cluster's brokers are checked
    against, and the logins its endpoint may name."""
    timeout = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}
    if endpoint.kind is EndpointKind.WEBHOOK:
        # aiohttp loads at a worker's first webhook: ~0.15 s of CPU off every worker start.
        from procbus.delivery.webhook import WebhookClient

        return WebhookClient(endpoint, secrets, **timeout)
    if endpoint.kind is EndpointKind.AMQP:
        # aio-pika loads only for an AMQP endpoint: a webhook-only worker never pays for it.
        from procbus.delivery.amqp import AmqpClient

        return AmqpClient(endpoint, **timeout)
    if endpoint.kind is EndpointKind.KAFKA:
        from procbus.delivery.kafka import KafkaClient

        return KafkaClient(
            endpoint,
            topic,
            transactional=transactional,
            allowlist=allowlist,
            credentials=kafka_credentials,
            **timeout,
        )
    raise InvalidRequest(f"no client for {endpoint.kind} endpoints")


def endpoint_check(
    allowlist: list[str] | None = None,
    kafka_credentials: Mapping[str, KafkaCredentials] | None = None,
    *,
    timeout_seconds: float | None = None,
) -> Callable[[Endpoint], Awaitable[None]]:
    """What `Topics(pool, check_endpoint=...)` asks before it creates a topic: a Kafka cluster
    is asked whether its brokers can be reached, the login is taken and the topic exists (or is
    created, with ?create=1); other endpoints are checked when they are sent to."""

    timeout = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}

    async def check(endpoint: Endpoint) -> None:
        if endpoint.kind is EndpointKind.KAFKA:
            from procbus.delivery.kafka import check_kafka_endpoint

            await check_kafka_endpoint(
                endpoint, allowlist or [], kafka_credentials or {}, **timeout
            )

    return check

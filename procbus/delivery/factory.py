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
    """Return the endpoint's client.

    Args:
        endpoint: where the topic delivers.
        secrets: the topic's signing secrets.
        timeout_seconds: bounds each send (the client's default when None).
        topic: the procbus topic a Kafka client delivers (its transactional.id).
        transactional: a Kafka client for a grouped topic.
        allowlist: what a Kafka cluster's brokers are checked against.
        kafka_credentials: the logins a Kafka endpoint may name.

    Raises:
        InvalidRequest: when no client serves the endpoint's kind.
    """
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
    """Return what `Topics(pool, check_endpoint=...)` asks before it creates a topic.

    A Kafka cluster is asked whether its brokers can be reached, the login is taken and the
    topic exists (or is created, with ?create=1); other endpoints are checked when they are
    sent to.
    """

    timeout = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}

    async def check(endpoint: Endpoint) -> None:
        if endpoint.kind is EndpointKind.KAFKA:
            from procbus.delivery.kafka import check_kafka_endpoint

            await check_kafka_endpoint(
                endpoint, allowlist or [], kafka_credentials or {}, **timeout
            )

    return check

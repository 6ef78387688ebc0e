"""AMQP endpoints (RabbitMQ, through aio-pika): a persistent message per event, on a channel
with publisher confirms. A message counts as delivered only when the broker confirmed it; a
nack, a returned (unroutable) message, a timeout or a lost connection is a failure to retry.

    amqp://user:password@host:5672/vhost?exchange=events&routing_key=orders
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from yarl import URL

from procbus.core import Endpoint
from procbus.delivery.clients import BATCH_ID_HEADER, EndpointClient, Message, Outcome, Sent
from procbus.delivery.resolution import checked_addresses
from procbus.errors import needs_extra

with needs_extra("amqp"):
    import aio_pika
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, FieldValue
    from aiormq.connection import TransportFactory
    from aiormq.exceptions import AMQPConnectionError

CONFIRM_TIMEOUT_SECONDS = 10.0
ERROR_TEXT_LIMIT = 200


class PinnedTransport(TransportFactory):
    """Opens the broker connection to an address that was checked (the first that answers),
    never to the name resolved again (DNS may answer otherwise the second time); TLS still
    verifies and sends the name."""

    def __init__(self, addresses: list[str], server_hostname: str) -> None:
        self.addresses = addresses
        self.server_hostname = server_hostname

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        provider = kwargs.pop("ssl_context_provider", None)
        tls: dict[str, Any] = {}
        if url.scheme == "amqps" and provider is not None:
            tls = {"ssl": await provider.get_context(), "server_hostname": self.server_hostname}
        failure = OSError(f"{self.server_hostname} has no checked address")
        for address in self.addresses:
            try:
                return await asyncio.open_connection(address, url.port, **tls, **kwargs)
            except OSError as error:
                failure = error
        raise AMQPConnectionError(*failure.args) from failure


class PinnedConnection(aio_pika.Connection):
    """aio-pika's connection, through a PinnedTransport (aio-pika passes no transport of its
    own choosing to aiormq)."""

    def __init__(self, url: URL, transport: PinnedTransport, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.kwargs["transport_factory"] = transport


class AmqpClient(EndpointClient):
    def __init__(self, endpoint: Endpoint, *, timeout_seconds: float = CONFIRM_TIMEOUT_SECONDS):
        parts = urlsplit(endpoint.url)
        query = parse_qs(parts.query)
        self.endpoint = endpoint
        self.broker_url = urlunsplit(parts._replace(query=""))
        self.exchange_name = query.get("exchange", [""])[-1]
        self.routing_key = query.get("routing_key", [""])[-1]
        self.timeout_seconds = timeout_seconds
        self.batch = endpoint.batch  # ?batch=1: a JSON array of events per message
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None

    async def _ready_exchange(self) -> AbstractExchange:
        if self._exchange is None:
            broker = URL(self.broker_url)
            # Checked once, connected to as checked: the name is not resolved a second time.
            addresses = await checked_addresses(self.endpoint.host, broker.port)
            connection = PinnedConnection(broker, PinnedTransport(addresses, self.endpoint.host))
            try:
                await connection.connect(timeout=self.timeout_seconds)
            except BaseException:
                # Closed now, not by its __del__ at some later collection (which, with no loop
                # running then, leaves a close() coroutine never awaited).
                with contextlib.suppress(Exception):
                    await connection.close()
                raise
            self._connection = connection
            # Confirms: publish() returns once the broker took the message; returned
            # (unroutable) messages raise instead of vanishing.
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            if self.exchange_name:
                self._exchange = await self._channel.get_exchange(self.exchange_name, ensure=True)
            else:
                self._exchange = self._channel.default_exchange
        return self._exchange

    async def send(self, message: Message) -> Sent:
        headers: dict[str, FieldValue] = {"webhook-id": message.id}
        if message.batch_id is not None:
            headers[BATCH_ID_HEADER] = message.batch_id
        try:
            exchange = await self._ready_exchange()
            await exchange.publish(
                aio_pika.Message(
                    body=message.body.encode(),
                    message_id=message.id,
                    content_type="application/json",
                    timestamp=message.timestamp,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    headers=headers,
                ),
                routing_key=self.routing_key,
                mandatory=True,
                timeout=self.timeout_seconds,
            )
        except Exception as error:  # aio-pika raises AMQP, socket and state errors alike
            await self.close()  # a fresh connection for the next message
            return Sent(Outcome.FAILED, f"{type(error).__name__}: {error}"[:ERROR_TEXT_LIMIT])
        return Sent(Outcome.ACK)

    async def close(self) -> None:
        connection, self._connection, self._channel, self._exchange = (
            self._connection,
            None,
            None,
            None,
        )
        if connection is not None:
            # It is gone either way.
            with contextlib.suppress(Exception):
                await connection.close()

"""Webhooks: an HTTP POST per message, signed per the Standard Webhooks spec.

Headers: webhook-id (the entry's ID, the same on every retry), webhook-timestamp (seconds since
the epoch) and webhook-signature (`v1,` + base64 HMAC-SHA256 over `id.timestamp.body`, one per
signing secret, space-separated, so a receiver can rotate without a gap). 2xx is an ACK; 410
GONE; 429 and 503 carry their Retry-After; anything else, a timeout or a refused connection is a
failure to retry. Redirects are not followed: an endpoint must not send procbus elsewhere.
"""

from __future__ import annotations

import email.utils
import socket
from datetime import UTC, datetime
from http import HTTPStatus

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from standardwebhooks.webhooks import Webhook

from procbus.core import Endpoint
from procbus.delivery.clients import BATCH_ID_HEADER, EndpointClient, Message, Outcome, Sent
from procbus.delivery.resolution import refused_resolution

REQUEST_TIMEOUT_SECONDS = 10.0
USER_AGENT = "procbus-webhooks/0.1"
# Longest error text kept with an entry: the start of the endpoint's answer.
ERROR_TEXT_LIMIT = 200
# The most of a reply's body ever read: an endpoint's answer must not fill the worker's memory.
REPLY_READ_LIMIT = 4096


def retry_after(header: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header: a number of seconds or an HTTP date."""
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - now).total_seconds(), 0.0)


def signature(secrets: list[str], message: Message) -> str:
    """The webhook-signature header: a v1 signature per secret, space-separated."""
    return " ".join(
        Webhook(secret).sign(msg_id=message.id, timestamp=message.timestamp, data=message.body)
        for secret in secrets
    )


async def reply_start(response: aiohttp.ClientResponse, limit: int = REPLY_READ_LIMIT) -> str:
    """The first `limit` bytes of a reply's body, decoded; the rest is never read (the
    connection is closed, not reused, when the response is released unread)."""
    start = bytearray()
    while len(start) < limit:
        chunk = await response.content.read(limit - len(start))
        if not chunk:
            break
        start += chunk
    try:
        return start.decode(response.charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return start.decode("utf-8", errors="replace")


class RefusingResolver(AbstractResolver):
    """aiohttp's resolver, refusing names that now resolve to link-local or metadata
    addresses: checked at each connection, not only when the topic was created."""

    def __init__(self) -> None:
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._resolver.resolve(host, port, family)
        refusal = refused_resolution(host, [answer["host"] for answer in answers])
        if refusal is not None:
            raise OSError(refusal)
        return answers

    async def close(self) -> None:
        await self._resolver.close()


class WebhookClient(EndpointClient):
    def __init__(
        self,
        endpoint: Endpoint,
        secrets: list[str],
        *,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        if not secrets:
            raise ValueError("a webhook endpoint needs a signing secret")
        self.endpoint = endpoint
        self.secrets = secrets
        self.batch = endpoint.batch
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        # aiohttp: under concurrent sends httpx's pool was twenty times slower here.
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:  # made on first use, inside the event loop
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=RefusingResolver()),
                timeout=self.timeout,
                headers={"user-agent": USER_AGENT, "content-type": "application/json"},
            )
        return self._http

    async def send(self, message: Message) -> Sent:
        headers = {
            "webhook-id": message.id,
            "webhook-timestamp": str(int(message.timestamp.timestamp())),
            "webhook-signature": signature(self.secrets, message),
        }
        if message.batch_id is not None:
            headers[BATCH_ID_HEADER] = message.batch_id
        try:
            async with self.http.post(
                self.endpoint.url, data=message.body, headers=headers, allow_redirects=False
            ) as response:
                status = response.status
                if 200 <= status < 300:
                    return Sent(Outcome.ACK)
                answer = (await reply_start(response)).strip()
                wait_header = response.headers.get("retry-after")
        except (TimeoutError, aiohttp.ClientError) as error:
            text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            return Sent(Outcome.FAILED, text[:ERROR_TEXT_LIMIT])
        text = f"HTTP {status}: {answer}"[:ERROR_TEXT_LIMIT]
        if status == HTTPStatus.GONE:
            return Sent(Outcome.GONE, text)
        wait = None
        if status in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE):
            wait = retry_after(wait_header, datetime.now(UTC))
        return Sent(Outcome.FAILED, text, wait)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

"""Webhooks: an HTTP POST per message, signed per the Standard Webhooks spec.

Headers: webhook-id (the entry's ID, the same on every retry), webhook-timestamp (seconds since
the epoch) and webhook-signature (`v1,` + base64 HMAC-SHA256 over `id.timestamp.body`, one per
signing secret, space-separated, so a receiver can rotate without a gap). 2xx is an ACK; 410
GONE; 429 and 503 carry their Retry-After; anything else, a timeout or a refused connection is a
failure to retry. Redirects are not followed: an endpoint must not send procbus elsewhere.
"""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime

import httpx
from standardwebhooks.webhooks import Webhook

from procbus.delivery.clients import EndpointClient, Message, Outcome, Sent
from procbus.delivery.endpoints import Endpoint

REQUEST_TIMEOUT_SECONDS = 10.0
USER_AGENT = "procbus-webhooks/0.1"
# Longest error text kept with an entry: the start of the endpoint's answer.
ERROR_TEXT_LIMIT = 200


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


class WebhookClient(EndpointClient):
    def __init__(
        self,
        endpoint: Endpoint,
        secrets: list[str],
        *,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not secrets:
            raise ValueError("a webhook endpoint needs a signing secret")
        self.endpoint = endpoint
        self.secrets = secrets
        self.batch = endpoint.batch
        self.http = httpx.AsyncClient(
            timeout=timeout_seconds,
            follow_redirects=False,
            headers={"user-agent": USER_AGENT, "content-type": "application/json"},
            transport=transport,
        )

    async def send(self, message: Message) -> Sent:
        headers = {
            "webhook-id": message.id,
            "webhook-timestamp": str(int(message.timestamp.timestamp())),
            "webhook-signature": signature(self.secrets, message),
        }
        try:
            response = await self.http.post(
                self.endpoint.url, content=message.body, headers=headers
            )
        except httpx.HTTPError as error:
            return Sent(Outcome.FAILED, f"{type(error).__name__}: {error}"[:ERROR_TEXT_LIMIT])
        if response.is_success:
            return Sent(Outcome.ACK)
        text = f"HTTP {response.status_code}: {response.text.strip()}"[:ERROR_TEXT_LIMIT]
        if response.status_code == httpx.codes.GONE:
            return Sent(Outcome.GONE, text)
        wait = None
        if response.status_code in (httpx.codes.TOO_MANY_REQUESTS, httpx.codes.SERVICE_UNAVAILABLE):
            wait = retry_after(response.headers.get("retry-after"), datetime.now(UTC))
        return Sent(Outcome.FAILED, text, wait)

    async def close(self) -> None:
        await self.http.aclose()

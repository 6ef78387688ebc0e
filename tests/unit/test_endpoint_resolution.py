"""Endpoint names are checked again where they resolve, at each connection: DNS may point a
name that passed at create at a link-local or metadata address later."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from procbus.delivery import webhook
from procbus.delivery.endpoints import refused_resolution


@pytest.mark.parametrize(
    ("addresses", "refused"),
    [
        (["127.0.0.1", "10.1.2.3"], False),
        (["10.1.2.3", "169.254.169.254"], True),
        (["fe80::1%eth0"], True),
        (["100.100.100.200"], True),
        (["2001:db8::1"], False),
    ],
)
def test_refused_resolution(addresses: list[str], refused: bool) -> None:
    assert (refused_resolution("hooks.example", addresses) is not None) == refused


class _Answers:
    def __init__(self, address: str) -> None:
        self.address = address

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> Any:
        return [
            {
                "hostname": host,
                "host": self.address,
                "port": port,
                "family": family,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None:
        return None


async def test_the_webhook_resolver_refuses_a_name_that_now_points_at_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(webhook, "DefaultResolver", lambda: _Answers("169.254.169.254"))
    with pytest.raises(OSError, match="resolves to 169.254.169.254: refused"):
        await webhook.RefusingResolver().resolve("hooks.example", 443)
    monkeypatch.setattr(webhook, "DefaultResolver", lambda: _Answers("10.0.0.5"))
    [answer] = await webhook.RefusingResolver().resolve("hooks.example", 443)
    assert answer["host"] == "10.0.0.5"

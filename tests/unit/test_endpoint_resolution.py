"""Endpoint names are checked again where they resolve, at each connection: DNS may point a
name that passed at create at a link-local or metadata address later."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiormq.abc import SSLCerts
from aiormq.connection import SSLContextProvider
from aiormq.exceptions import AMQPConnectionError
from yarl import URL

from procbus.core.endpoints import parse_endpoint
from procbus.delivery import webhook
from procbus.delivery.amqp import PinnedTransport
from procbus.delivery.resolution import checked_addresses, refused_resolution
from procbus.errors import InvalidRequest
from procbus.stack.processes import LOOPBACK


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


# IPv6 addresses that carry 169.254.169.254 (the metadata service): a connection to any of them
# reaches it (IPv4-mapped, IPv4-compatible, 6to4, NAT64), so each is refused as the IPv4 address.
METADATA_IN_IPV6 = [
    "::ffff:169.254.169.254",
    "::ffff:a9fe:a9fe",
    "0:0:0:0:0:ffff:a9fe:a9fe",
    "::169.254.169.254",
    "2002:a9fe:a9fe::1",
    "64:ff9b::169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "::ffff:100.100.100.200",  # Alibaba's metadata address
]


@pytest.mark.parametrize("address", METADATA_IN_IPV6)
def test_an_ipv6_address_carrying_a_metadata_address_is_refused(address: str) -> None:
    with pytest.raises(InvalidRequest, match="link-local or cloud metadata address"):
        parse_endpoint(f"http://[{address}]/latest/meta-data")
    with pytest.raises(InvalidRequest, match="link-local or cloud metadata address"):
        parse_endpoint(f"http://[{address}]/", allowlist=["0.0.0.0/0", "::/0"])
    assert refused_resolution("hooks.example", ["10.0.0.1", address]) is not None


def test_the_refusal_says_which_ipv4_address_it_carries() -> None:
    with pytest.raises(InvalidRequest, match=r"::ffff:169.254.169.254 carries 169.254.169.254"):
        parse_endpoint("http://[::ffff:169.254.169.254]/")


@pytest.mark.parametrize(
    ("address", "says"),
    [("::ffff:0.0.0.0", "not a single host"), ("64:ff9b::224.0.0.1", "not a single host")],
)
def test_other_rules_see_the_embedded_address_too(address: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_endpoint(f"http://[{address}]/")


@pytest.mark.parametrize(
    ("host", "allowlist", "passes"),
    [
        ("[::ffff:10.0.0.5]", ["10.0.0.0/8"], True),
        ("[64:ff9b::10.0.0.5]", ["10.0.0.0/8"], True),
        ("[2002:a00:5::1]", ["10.0.0.0/8"], True),
        ("[::ffff:10.0.0.5]", ["10.0.0.5"], True),
        ("[::ffff:8.8.8.8]", ["10.0.0.0/8"], False),
        ("[::ffff:8.8.8.8]", ["8.8.4.4"], False),
        ("10.0.0.5", ["10.0.0.5"], True),
        ("[::1]", ["::1"], True),  # loopback is no IPv4-compatible address
        ("[::1]", ["0.0.0.0/8"], False),
    ],
)
def test_the_allowlist_sees_the_embedded_address(
    host: str, allowlist: list[str], passes: bool
) -> None:
    url = f"http://{host}/hooks"
    if passes:
        assert parse_endpoint(url, allowlist).url == url
    else:
        with pytest.raises(InvalidRequest, match="not in PROCBUS_ENDPOINT_ALLOWLIST"):
            parse_endpoint(url, allowlist)


async def test_the_webhook_resolver_refuses_a_mapped_metadata_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(webhook, "DefaultResolver", lambda: _Answers("::ffff:169.254.169.254"))
    with pytest.raises(OSError, match="carries 169.254.169.254"):
        await webhook.RefusingResolver().resolve("hooks.example", 443, socket.AF_INET6)


async def test_the_amqp_check_refuses_a_mapped_metadata_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    async def answers(host: str, port: object, **_: object) -> list[Any]:
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:169.254.169.254", 5672))]

    monkeypatch.setattr(loop, "getaddrinfo", answers)
    with pytest.raises(OSError, match="carries 169.254.169.254"):
        await checked_addresses("broker.example", 5672)
    with pytest.raises(OSError, match="carries 169.254.169.254"):
        await checked_addresses("::ffff:169.254.169.254", 5672)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for broker.test only, and its key."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=broker.test", "-addext", "subjectAltName=DNS:broker.test"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_a_pinned_amqps_connection_still_verifies_and_sends_the_name(
    certificate: tuple[Path, Path],
) -> None:
    """Connected at a checked address (the first that answers), TLS still asks for (SNI) and
    verifies the broker's name: a real TLS server on 127.0.0.1 (nothing on 127.0.0.2) with a
    certificate for broker.test only."""
    cert, key = certificate
    asked_for: list[str | None] = []
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)

    def remember(_socket: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
        asked_for.append(name)

    server_side.sni_callback = remember

    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(greet, LOOPBACK, 0, ssl=server_side)
    port = server.sockets[0].getsockname()[1]
    client_side = ssl.create_default_context(cafile=str(cert))
    provider = SSLContextProvider(
        ssl_context=client_side,
        ssl_certs=SSLCerts(None, None, None, None, None, True),
        loop=asyncio.get_running_loop(),
    )
    async with server:
        transport = PinnedTransport(["127.0.0.2", LOOPBACK], "broker.test")
        _, writer = await transport.create(
            URL(f"amqps://broker.test:{port}/"), ssl_context_provider=provider
        )
        writer.close()
        assert asked_for == ["broker.test"]
        # The name is verified: a certificate for another name is refused.
        with pytest.raises(AMQPConnectionError, match="certificate verify failed"):
            await PinnedTransport([LOOPBACK], "other.test").create(
                URL(f"amqps://other.test:{port}/"), ssl_context_provider=provider
            )

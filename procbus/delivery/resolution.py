"""An endpoint's host resolved when a delivery client connects, and checked again: a name that
passed when its topic was created may since resolve to a link-local or metadata address."""

from __future__ import annotations

import asyncio
import socket

from procbus.core import literal_address, refused_address


def refused_resolution(host: str, addresses: list[str]) -> str | None:
    """Why a name must not be connected to now, or None: it was checked when its topic was
    created, but DNS may since point it at a link-local or metadata address."""
    for address in addresses:
        refusal = refused_address(address.split("%", 1)[0])  # fe80::1%eth0
        if refusal is not None:
            return f"{host} resolves to {address}: refused, {refusal}"
    return None


async def checked_addresses(host: str, port: int | None) -> list[str]:
    """The addresses `host` resolves to now, checked: connect to one of these, not to the name
    (resolved again, it may answer otherwise). OSError when it resolves to a refused address
    (for clients that cannot plug in a resolver of their own)."""
    if literal_address(host) is not None:
        refusal = refused_address(host)
        if refusal is not None:
            raise OSError(f"{host}: refused, {refusal}")
        return [host]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    refusal = refused_resolution(host, addresses)
    if refusal is not None:
        raise OSError(refusal)
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    return addresses

"""A TCP proxy that delays what it forwards: the nemesis's latency fault. The kernel here has no
`netem` qdisc, so the harness adds a link's latency with a proxy of its own, run in the server's
host namespace, between each worker and the server (procbus.testing.cluster).

    python -m procbus.testing.proxy --route w1=10.0.0.2:15433/10.0.0.2:5432 ...

Each route is NAME=LISTEN_HOST:LISTEN_PORT/TARGET_HOST:TARGET_PORT. Once every route listens it
prints `ready`. Its standard input takes lines `NAME SECONDS`: from then on, each chunk on that
route's connections, both ways, is forwarded SECONDS after it arrived, in order (0: at once).
It exits when its standard input closes: the harness that started it is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import sys
from dataclasses import dataclass

CHUNK = 65536


@dataclass
class Route:
    name: str
    listen: tuple[str, int]
    target: tuple[str, int]
    delay: float = 0.0


def parse_route(text: str) -> Route:
    """NAME=HOST:PORT/HOST:PORT, the listening address first."""
    name, _, addresses = text.partition("=")
    listen, _, target = addresses.partition("/")
    if not (name and listen and target):
        raise argparse.ArgumentTypeError(f"a route is NAME=HOST:PORT/HOST:PORT, not {text!r}")
    return Route(name, _address(listen), _address(target))


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _forward(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route
) -> None:
    """One direction: each chunk written `route.delay` seconds after it was read, in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not chunk:  # the other side closed its end: close ours, after what came before
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        while chunk := await reader.read(CHUNK):
            queue.put_nowait((loop.time() + route.delay, chunk))
    finally:
        queue.put_nowait((loop.time() + route.delay, b""))
        await delivering


async def _serve(route: Route, client: asyncio.StreamReader, back: asyncio.StreamWriter) -> None:
    try:
        upstream, forth = await asyncio.wait_for(asyncio.open_connection(*route.target), 10)
    except (OSError, TimeoutError):  # the server is down (restarting): the client sees a close
        back.close()
        return
    try:
        async with asyncio.TaskGroup() as both_ways:
            both_ways.create_task(_forward(client, forth, route))
            both_ways.create_task(_forward(upstream, back, route))
    except* OSError:
        pass  # a reset on either side ends the connection, as a broken link would
    finally:
        for writer in (forth, back):
            writer.close()


async def _control(routes: dict[str, Route]) -> None:
    """Delays from standard input until it closes."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        name, seconds = line.decode().split()
        routes[name].delay = float(seconds)


async def main(routes: list[Route]) -> None:
    servers = [
        await asyncio.start_server(
            functools.partial(_serve, route), *route.listen, reuse_address=True
        )
        for route in routes
    ]
    print("ready", flush=True)
    try:
        await _control({route.name: route for route in routes})
    finally:
        for server in servers:
            server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--route", type=parse_route, action="append", required=True)
    asyncio.run(main(parser.parse_args().route))

"""The nemesis's latency proxy (procbus.testing.proxy), on loopback: it forwards both ways, in
order, and once told a delay, each way waits that long."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from procbus.stack.processes import free_port


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def round_trip(port: int, messages: list[bytes]) -> tuple[bytes, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.monotonic()
    for message in messages:
        writer.write(message)
    await writer.drain()
    expected = sum(len(m) for m in messages)
    received = b""
    while len(received) < expected:
        received += await reader.read(1024)
    took = time.monotonic() - began
    writer.close()
    return received, took


@pytest.mark.timeout(60)
async def test_it_forwards_in_order_and_delays_each_way_once_told() -> None:
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    listen = free_port()
    route = f"w1=127.0.0.1:{listen}/127.0.0.1:{target}"
    proxy = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "procbus.testing.proxy",
        "--route",
        route,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proxy.stdout is not None and proxy.stdin is not None
        assert (await proxy.stdout.readline()).strip() == b"ready"
        messages = [f"message {n};".encode() for n in range(50)]
        received, _ = await round_trip(listen, messages)
        assert received == b"".join(messages)
        proxy.stdin.write(b"w1 0.4\n")
        await proxy.stdin.drain()
        await asyncio.sleep(0.5)  # the proxy reads its orders on its own
        received, took = await round_trip(listen, messages)
        assert received == b"".join(messages)
        assert took >= 0.8  # 0.4 s to the server, 0.4 s back
        proxy.stdin.close()  # its harness gone: it exits
        assert await asyncio.wait_for(proxy.wait(), 10) == 0
    finally:
        if proxy.returncode is None:
            proxy.kill()
        server.close()

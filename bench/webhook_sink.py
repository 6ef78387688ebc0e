"""A webhook receiver for bench/topics.py, in its own process (its own core): it takes one event
or a batch per POST, answers 200, and keeps what a benchmark asks for.

    python bench/webhook_sink.py PORT

GET /stats gives {"events": N, "requests": M, "latencies": [[arrival, latency], ...]} where a
latency is arrival time minus the event's data["t"] (its commit time), for the events that
carry one; POST /reset starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator

from aiohttp import web

# "latencies": [arrival, latency] pairs, seconds.
state: dict[str, list[list[float]] | int] = {"events": 0, "requests": 0, "latencies": []}


async def take(request: web.Request) -> web.Response:
    arrived = time.time()
    loaded = json.loads(await request.read())
    events = loaded if isinstance(loaded, list) else [loaded]
    state["events"] = int(state["events"]) + len(events)  # type: ignore[arg-type]
    state["requests"] = int(state["requests"]) + 1  # type: ignore[arg-type]
    latencies = state["latencies"]
    assert isinstance(latencies, list)
    for event in events:
        sent = event.get("data", {}).get("t") if isinstance(event.get("data"), dict) else None
        if sent is not None:
            latencies.append([arrived, arrived - sent])
    return web.Response(text="ok")


async def stats(request: web.Request) -> web.Response:
    return web.json_response(state)


async def reset(request: web.Request) -> web.Response:
    state.update(events=0, requests=0, latencies=[])
    return web.Response(text="ok")


@contextlib.asynccontextmanager
async def running_sink() -> AsyncIterator[str]:
    """This receiver in a process of its own (its own core), ready; yields its base URL."""
    import aiohttp  # the client side, for the benchmarks that start the sink

    from procbus.stack.processes import LOOPBACK, free_port

    port = free_port()
    process = await asyncio.create_subprocess_exec(sys.executable, __file__, str(port))
    base = f"http://{LOOPBACK}:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # the process starts
                try:
                    await (await http.get(f"{base}/stats")).read()
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        yield base
    finally:
        process.terminate()
        await process.wait()


if __name__ == "__main__":
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/hooks", take)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)

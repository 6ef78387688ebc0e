"""A real HTTP receiver for topic tests: aiohttp on 127.0.0.1, recording every request, its
answers chosen by the test (an endpoint that is down, failing for one key, gone, slow)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from procbus.stack.processes import LOOPBACK, free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: str

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events of the request: one, or a batch."""
        loaded = json.loads(self.body)
        return loaded if isinstance(loaded, list) else [loaded]


Answer = tuple[int, dict[str, str]]


@dataclass
class WebhookReceiver:
    port: int = field(default_factory=free_port)
    path: str = "/hooks"
    received: list[Received] = field(default_factory=list)  # every request, answered or not
    accepted: list[Received] = field(default_factory=list)  # the ones answered 2xx
    answer: Callable[[list[dict[str, Any]]], Answer] = lambda events: (200, {})
    # When set, chooses the status from the request's headers and events instead.
    answer_with_headers: Callable[[dict[str, str], list[dict[str, Any]]], int] | None = None
    delay_seconds: float = 0.0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}{self.path}"

    async def _handle(self, request: web.Request) -> web.Response:
        got = Received(dict(request.headers), await request.text())
        self.received.append(got)
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
        if self.answer_with_headers is not None:
            status, headers = self.answer_with_headers(got.headers, got.events), {}
        else:
            status, headers = self.answer(got.events)
        if 200 <= status < 300:
            self.accepted.append(got)
        return web.Response(status=status, headers=headers, text="ok" if status < 300 else "no")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(self.path, self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def accepted_events(self) -> list[dict[str, Any]]:
        return [event for request in self.accepted for event in request.events]

    async def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Until `count` events were accepted; they come back in arrival order."""
        async with asyncio.timeout(timeout):
            while len(self.accepted_events()) < count:
                await asyncio.sleep(0.05)
        return self.accepted_events()

"""A small webhook receiver on 127.0.0.1, for the demo (and the e2e tests): it records what it
accepts, answers 500 to the events of chosen keys, and can be down (not listening) and back."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from procbus.stack import LOOPBACK, free_port


@dataclass(frozen=True)
class Accepted:
    headers: dict[str, str]
    body: str

    @property
    def event(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.body)
        return loaded

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events of the request: one, or a batch (?batch=1)."""
        loaded = json.loads(self.body)
        return loaded if isinstance(loaded, list) else [loaded]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the name http.server calls
        body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
        owner = self.server.receiver  # type: ignore[attr-defined]
        loaded = json.loads(body)
        events = loaded if isinstance(loaded, list) else [loaded]  # a batch, or one event
        failing = any(event.get("key") in owner.failing for event in events)
        if not failing:
            with owner.lock:
                owner.accepted.append(Accepted(dict(self.headers), body))
        self.send_response(500 if failing else 200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None  # quiet: the caller reports what matters


class WebhookReceiver:
    """Start with `up()`, stop with `down()`; the URL stays the same in between."""

    def __init__(self) -> None:
        self.port = free_port()
        self.accepted: list[Accepted] = []
        self.failing: set[str] = set()
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/hooks"

    def up(self) -> None:
        server = ThreadingHTTPServer((LOOPBACK, self.port), _Handler)
        server.receiver = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [accepted.event for accepted in self.accepted]

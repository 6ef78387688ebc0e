"""`procbus topic ...` as a user runs it, on a `procbus dev` stack, delivering to a real HTTP
receiver: create, publish, stats, dead letters, redrive, bad input."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standardwebhooks.webhooks import Webhook

from procbus.stack.processes import LOOPBACK, free_port
from tests.e2e.conftest import DevStack, procbus


class Receiver(ThreadingHTTPServer):
    """Records what it accepts; answers 500 to events of the keys in `failing`."""

    def __init__(self) -> None:
        self.accepted: list[tuple[dict[str, str], str]] = []
        self.failing: set[str] = set()
        super().__init__((LOOPBACK, free_port()), _Handler)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/hooks"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"])).decode()
        failed = json.loads(body)["key"] in self.server.failing
        if not failed:
            self.server.accepted.append((dict(self.headers), body))
        self.send_response(500 if failed else 200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def ok(stack: DevStack, *args: str) -> str:
    result = procbus(stack.env, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_topics_from_the_cli(dev_stack: DevStack, receiver: Receiver) -> None:
    dev_stack.start()
    created = json.loads(
        ok(
            dev_stack,
            "topic",
            "create",
            "orders",
            "--endpoint",
            receiver.url,
            "--max-retries",
            "0",
            "--retry-sleep",
            "0.1",
            "--json",
        )
    )
    secret = created["secret"]
    assert created["topic"]["endpoint"] == receiver.url
    for args, says in [
        (["topic", "create", "orders", "--endpoint", receiver.url], "exists already"),
        (
            ["topic", "create", "t2", "--endpoint", receiver.url, "--max-entries", "0"],
            "max_entries",
        ),
        (["topic", "create", "t3", "--endpoint", "http://169.254.169.254/x"], "link-local"),
        (["topic", "create", "t4", "--endpoint", receiver.url, "--secret", "abc"], "whsec_"),
        (["topic", "publish", "nothing", "--payload", "1"], "no topic named 'nothing'"),
        (["topic", "publish", "orders", "--payload", "{not json"], "--payload is not JSON"),
        (["topic", "redrive", "orders"], "--id ID (repeatable) or --all"),
    ]:
        result = procbus(dev_stack.env, *args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert [t["name"] for t in json.loads(ok(dev_stack, "topic", "list", "--json"))] == ["orders"]

    receiver.failing = {"bad"}
    for number, key in enumerate(["a", "bad", "a", "b"]):
        ok(
            dev_stack,
            "topic",
            "publish",
            "orders",
            "--payload",
            json.dumps({"n": number}),
            "--key",
            key,
        )
    wait_for(lambda: len(receiver.accepted) == 3)
    for headers, body in receiver.accepted:
        Webhook(secret).verify(body, headers)
    assert [json.loads(body)["data"]["n"] for _, body in receiver.accepted if '"a"' in body] == [
        0,
        2,
    ]

    def stats() -> dict[str, object]:
        loaded: dict[str, object] = json.loads(ok(dev_stack, "topic", "stats", "orders", "--json"))
        return loaded

    wait_for(lambda: stats()["dead_letters"] == 1)
    [dead] = json.loads(ok(dev_stack, "topic", "dead-letters", "orders", "--json"))
    assert (dead["key"], dead["attempts"], dead["payload"]) == ("bad", 1, {"n": 1})
    receiver.failing = set()
    ok(dev_stack, "topic", "redrive", "orders", "--id", str(dead["id"]))
    wait_for(lambda: len(receiver.accepted) == 4)
    assert json.loads(receiver.accepted[-1][1])["data"] == {"n": 1}
    assert receiver.accepted[-1][0]["webhook-id"] == dead["webhook_id"]
    wait_for(lambda: stats()["depth"] == 0 and stats()["delivered"] == 4)
    final = stats()
    assert (final["dead_lettered"], final["dead_letters"], final["enabled"]) == (1, 0, True)
    rotated = json.loads(ok(dev_stack, "topic", "rotate-secret", "orders", "--json"))["secret"]
    ok(dev_stack, "topic", "publish", "orders", "--payload", "5")
    wait_for(lambda: len(receiver.accepted) == 5)
    headers, body = receiver.accepted[-1]
    assert len(headers["webhook-signature"].split()) == 2  # the new secret and the old one
    Webhook(rotated).verify(body, headers)
    Webhook(secret).verify(body, headers)
    ok(dev_stack, "topic", "delete", "orders")
    assert json.loads(ok(dev_stack, "topic", "list", "--json")) == []

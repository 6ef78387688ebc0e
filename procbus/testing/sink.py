"""A webhook receiver for a test cluster's `sink` host: every request it is sent, as one JSON
line of its journal, answered 200. The nemesis's topic checker reads the journal after a run:
what arrived, in what order, in which request.

    python -m procbus.testing.sink --host ADDRESS --port PORT --journal FILE
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from procbus.delivery import BATCH_ID_HEADER


def journal_line(request_path: str, headers: dict[str, str], body: str) -> str:
    """One request as its journal line: when it came, its IDs and its events (one, or a
    batch)."""
    loaded: Any = json.loads(body)
    events = loaded if isinstance(loaded, list) else [loaded]
    record = {
        "at": time.time(),
        "path": request_path,
        "webhook_id": headers.get("webhook-id"),
        "batch_id": headers.get(BATCH_ID_HEADER),
        "events": events,
    }
    return json.dumps(record) + "\n"


def application(journal: Path) -> web.Application:
    async def receive(request: web.Request) -> web.Response:
        line = journal_line(request.path, dict(request.headers), await request.text())
        with journal.open("a") as out:  # written before the answer: an answered request is in it
            out.write(line)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{path:.*}", receive)
    return app


def read_journal(journal: Path) -> list[dict[str, Any]]:
    """Every request the sink received, in arrival order."""
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", type=Path, required=True)
    arguments = parser.parse_args(argv)
    web.run_app(
        application(arguments.journal), host=arguments.host, port=arguments.port, print=None
    )


if __name__ == "__main__":
    main()

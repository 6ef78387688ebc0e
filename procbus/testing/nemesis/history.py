"""A nemesis run's history: every event, in order, with its time."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class History:
    """What happened, in order: each event with its time (seconds from the start)."""

    started: float = field(default_factory=time.monotonic)
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, event: str, **details: Any) -> None:
        at = round(time.monotonic() - self.started, 3)
        with self._lock:
            self.events.append({"t": at, "event": event, **details})

    def of(self, event: str) -> list[dict[str, Any]]:
        return [recorded for recorded in self.events if recorded["event"] == event]

    def write(self, path: Path) -> None:
        path.write_text("".join(json.dumps(event) + "\n" for event in self.events))

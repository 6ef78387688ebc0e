"""The logs of `procbus worker` and `procbus dev`: on stderr, at PROCBUS_LOG_LEVEL, as text or
as one JSON object a line (PROCBUS_LOG_FORMAT) for a log collector. Neither set: Python's
default (warnings and errors, their message only)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time (UTC), level, logger, message, and the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str | None, form: str = "text", stream: TextIO | None = None) -> None:
    """Log to `stream` (stderr) at `level` (WARNING when None) in `form`, text or json.

    A handler beside those already on the root logger (an OpenTelemetry one stays); with
    neither a level nor json asked for, logging is left as it is.
    """
    if level is None and form == "text":
        return
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if form == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level or logging.WARNING)

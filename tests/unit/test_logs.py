"""PROCBUS_LOG_LEVEL and PROCBUS_LOG_FORMAT: the logs of `procbus worker` and `procbus dev`."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from procbus.config import Settings, load_settings
from procbus.errors import ConfigError
from procbus.starter.logs import configure_logging


@pytest.fixture(autouse=True)
def root_logger_kept() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_are_one_object_a_line_with_the_traceback() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    log = logging.getLogger("procbus.test")
    log.debug("not shown")
    log.info("relay started on %s", "procbus")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("delivery failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "procbus.test"
    assert first["message"] == "relay started on procbus"
    assert first["time"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc_info"]


def test_text_logs_at_the_level_asked_for() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "text", stream)
    logging.getLogger("procbus.test").info("not shown")
    logging.getLogger("procbus.test").warning("lease renewal late")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" WARNING procbus.test: lease renewal late")


def test_unset_leaves_logging_as_it_is() -> None:
    root = logging.getLogger()
    before = root.handlers[:]
    configure_logging(None, "text")
    assert root.handlers == before


def test_the_settings_take_either_case_and_refuse_other_levels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROCBUS_LOG_LEVEL", "debug")
    monkeypatch.setenv("PROCBUS_LOG_FORMAT", "JSON")
    settings = Settings()
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")
    monkeypatch.setenv("PROCBUS_LOG_LEVEL", "loud")

    with pytest.raises(ConfigError, match="invalid setting PROCBUS_LOG_LEVEL"):
        load_settings()

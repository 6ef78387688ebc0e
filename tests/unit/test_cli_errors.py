"""A failing command's error: one line on stderr, or under `--json` one JSON object there (its
type, message and exit code); stdout keeps only results, and the exit code is the same."""

from __future__ import annotations

import json

import pytest

from procbus.starter.cli import run

# No procbus or Temporal setting, profile or dev stack of the machine running the tests.
pytestmark = pytest.mark.usefixtures("no_configured_services")


def errors_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = run(argv)
    shown = capsys.readouterr()
    assert shown.out == ""
    return code, shown.err


def test_a_procbus_error_under_json_is_a_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = errors_of(capsys, ["proc", "list", "--json"])
    assert code == 1
    error = json.loads(err)
    assert error["type"] == "StackError"
    assert "no embedded stack runs" in error["message"]
    assert error["exit_code"] == 1
    code, err = errors_of(capsys, ["proc", "list"])
    assert code == 1
    assert err.startswith("error: PROCBUS_TEMPORAL_ADDRESS is not set")


def test_a_bad_setting_under_json_keeps_its_exit_code(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROCBUS_TEMPORAL_TLS_CERT", "/nonexistent/cert.pem")
    code, err = errors_of(capsys, ["proc", "list", "--json"])
    assert code == 2
    assert json.loads(err) == {
        "type": "ConfigError",
        "message": "invalid setting PROCBUS_TEMPORAL_TLS_CERT: no such file: /nonexistent/cert.pem",
        "exit_code": 2,
    }


def test_a_usage_error_under_json_is_a_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = errors_of(capsys, ["proc", "status", "--json"])
    assert code == 2
    error = json.loads(err)
    assert error["type"] == "MissingParameter"
    assert "Missing argument" in error["message"]
    code, err = errors_of(capsys, ["proc", "status"])
    assert code == 2
    assert "Usage: procbus proc status" in err


def test_json_after_a_double_dash_is_an_argument(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = errors_of(capsys, ["proc", "status", "--", "--json"])
    assert code == 1
    assert err.startswith("error: ")

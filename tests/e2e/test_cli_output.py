"""What the CLI prints when its output is piped: nothing wrapped, so lines stay whole."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.conftest import PROCBUS
from tests.services import subprocess_environment


def test_piped_output_is_not_wrapped(state_dir: Path) -> None:
    env = subprocess_environment(state_dir)
    env.pop("COLUMNS", None)
    result = subprocess.run(
        [str(PROCBUS), "status"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1  # no stack runs on this state folder
    reason = (
        f"PROCBUS_TEMPORAL_ADDRESS is not set and no embedded stack runs on {state_dir}: start "
        "one with `procbus dev`, or set PROCBUS_TEMPORAL_ADDRESS"
    )
    assert len(reason) > 80
    assert any(reason in line for line in result.stdout.splitlines()), result.stdout


def test_every_help_answers_without_a_stack(state_dir: Path) -> None:
    env = subprocess_environment(state_dir)
    for command in ([], ["table"], ["table", "create"], ["proc", "abort"], ["lock", "list"]):
        result = subprocess.run(
            [str(PROCBUS), *command, "--help"], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, (command, result.stderr)
        assert "Usage:" in result.stdout


def test_an_error_quoting_input_prints_it_verbatim(state_dir: Path) -> None:
    env = subprocess_environment(state_dir)
    name = "root:x:0[bold].orders"
    result = subprocess.run(
        [str(PROCBUS), "table", "read", name], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    # Neither an emoji for ':x:' nor a markup tag eaten: the name as it was typed.
    assert "'root:x:0[bold]'" in result.stderr, result.stderr
    assert "\N{CROSS MARK}" not in result.stderr

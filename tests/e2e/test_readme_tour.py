"""The README's five-minute tour, run line by line as a person would, on a `procbus dev` stack."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import DevStack

pytestmark = pytest.mark.spark

PROJECT = Path(__file__).resolve().parents[2]


def tour_commands() -> list[str]:
    """The command lines of the tour's second block (the first starts the stack), continuation
    lines joined, comment-only lines left out."""
    readme = (PROJECT / "README.md").read_text()
    section = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, "the tour: one block starting the stack, one of commands"
    commands = []
    for line in blocks[1].replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    return commands


def test_the_tour_runs_as_the_readme_says(dev_stack: DevStack, tmp_path: Path) -> None:
    dev_stack.start()
    # The tour names the state folder as `make dev` makes it: .procbus in the working folder.
    (tmp_path / ".procbus").symlink_to(dev_stack.state_dir)
    env = {
        **dev_stack.env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    commands = tour_commands()
    assert len(commands) >= 10
    outputs = {}
    for command in commands:
        ran = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        # A line whose comment says it rolls back must fail; every other line must succeed.
        expected = 1 if "ROLLED_BACK" in command else 0
        assert ran.returncode == expected, (command, ran.stdout, ran.stderr)
        outputs[command.split("#")[0].strip()] = ran.stdout
    page = json.loads(outputs["procbus table read sales.orders --limit 1 --json"])
    assert (len(page["rows"]), page["row_count"], page["truncated"]) == (1, 3, True)
    assert (
        "exists already" in outputs["procbus table create sales.orders --schema 'id:bigint' --wait"]
    )

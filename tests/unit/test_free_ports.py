"""Ports for servers started later: one process never hands out a port another still holds."""

from __future__ import annotations

import subprocess
import sys

from procbus.stack.processes import free_port


def draw_only(port: int) -> subprocess.CompletedProcess[str]:
    """`free_port()` in another process whose every random draw is `port`."""
    code = (
        "import random\n"
        "from procbus.stack import processes\n"
        f"random.randrange = lambda start, stop: {port}\n"
        "print(processes.free_port())\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_port_this_process_handed_out_is_not_handed_out_by_another() -> None:
    held = free_port()  # chosen, not yet bound: its server would start seconds later
    refused = draw_only(held)
    assert refused.returncode == 1, refused.stdout
    assert "no free port" in refused.stderr


def test_a_port_is_free_to_hand_out_again_once_its_process_ended() -> None:
    ended = subprocess.run(
        [sys.executable, "-c", "from procbus.stack.processes import free_port; print(free_port())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    port = int(ended.stdout)
    given = draw_only(port)
    assert given.returncode == 0, given.stderr
    assert int(given.stdout) == port

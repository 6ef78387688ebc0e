"""The suite's CPU probe counts what a test's child processes spent, and sums by test group."""

from __future__ import annotations

import subprocess
import sys

import psutil

from tests.cpu_probe import group_of, summary, tree_cpu_seconds

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"


def test_a_child_that_ended_is_counted_in_its_parent() -> None:
    before = tree_cpu_seconds(psutil.Process())
    subprocess.run([sys.executable, "-c", BURN], check=True)
    assert tree_cpu_seconds(psutil.Process()) - before >= 0.5


def test_a_live_child_is_counted_too() -> None:
    burnt_then_waits = BURN + "\nprint('burnt', flush=True)\ntime.sleep(60)"
    before = tree_cpu_seconds(psutil.Process())
    child = subprocess.Popen([sys.executable, "-c", burnt_then_waits], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"burnt\n"
        assert tree_cpu_seconds(psutil.Process()) - before >= 0.5
    finally:
        child.kill()
        child.wait()


def test_tests_are_summed_by_their_xdist_group_else_their_file() -> None:
    records: list[dict[str, object]] = [
        {"test": "tests/a.py::t1@spark-session", "cpu": 2.0, "wall": 1.0},
        {"test": "tests/b.py::t2@spark-session", "cpu": 3.0, "wall": 1.0},
        {"test": "tests/c.py::t3", "cpu": 1.0, "wall": 4.0},
    ]
    assert group_of("tests/c.py::t3") == "tests/c.py"
    lines = summary(records).splitlines()
    assert lines[0].split()[0] == "6.0"
    assert lines[2].split() == ["5.0", "2.0", "2", "spark-session"]
    assert lines[3].split() == ["1.0", "4.0", "1", "tests/c.py"]

"""Where the suite's CPU goes: each test's CPU seconds, counted over its pytest process and every
process below it (`make suite-cpu`; `-p tests.cpu_probe --cpu-probe FILE`).

A test's figure is what its process tree spent between the test's start and end: the pytest
process itself, the servers, workers, CLI calls and JVMs it started (a process that ended meanwhile
is counted in its parent's children's times once reaped). Set-up shared by a module or the
session counts in the test that first needed it. Under xdist each process appends its tests to
FILE as JSON lines; `python -m tests.cpu_probe FILE` sums them by test group, heaviest first.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

_started: dict[str, tuple[float, float]] = {}
_output = ""  # --cpu-probe FILE, once configured


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-probe", metavar="FILE", help="append each test's CPU seconds to FILE")


def tree_cpu_seconds(root: psutil.Process) -> float:
    """CPU seconds spent by `root` and the processes below it, reaped children included."""
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            spent = process.cpu_times()
        except psutil.Error:  # ended between the listing and the read
            continue
        total += spent.user + spent.system + spent.children_user + spent.children_system
    return total


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    if item.config.getoption("cpu_probe"):
        _started[item.nodeid] = (time.time(), tree_cpu_seconds(psutil.Process()))


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str) -> None:
    started = _started.pop(nodeid, None)
    if started is None:
        return
    began, cpu_before = started
    record = {
        "test": nodeid,
        "process": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "began": began,
        "wall": time.time() - began,
        "cpu": tree_cpu_seconds(psutil.Process()) - cpu_before,
    }
    with open(_output, "a") as output:
        output.write(json.dumps(record) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    global _output
    _output = config.getoption("cpu_probe") or ""


def group_of(test: str) -> str:
    """The xdist group written into the test's ID (`...@group`), else its file."""
    return test.rsplit("@", 1)[1] if "@" in test else test.split("::")[0]


def summary(records: list[dict[str, object]]) -> str:
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for record in records:
        figures = groups[group_of(str(record["test"]))]
        figures[0] += float(str(record["cpu"]))
        figures[1] += float(str(record["wall"]))
        figures[2] += 1
    total = sum(figures[0] for figures in groups.values())
    lines = [f"{total:8.1f} s of CPU in {len(records)} tests", "     cpu     wall  tests  group"]
    for group, (cpu, wall, count) in sorted(groups.items(), key=lambda item: -item[1][0]):
        lines.append(f"{cpu:8.1f} {wall:8.1f} {int(count):6d}  {group}")
    return "\n".join(lines)


if __name__ == "__main__":
    lines = Path(sys.argv[1]).read_text().splitlines()
    print(summary([json.loads(line) for line in lines if line.strip()]))

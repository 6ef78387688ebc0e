"""Smoke runs of the benchmarks in bench/: each script itself as a subprocess at its least size
(BENCH_SMOKE=1, bench/harness.py), its last line's figures checked against the keys it declares."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).parents[1] / "bench"
# What a healthy smoke run never prints (a benchmark's own lines name none of these).
SUSPICIOUS = re.compile(
    r"Traceback|Exception|Error\b|\berror\b|never retrieved|never awaited|could not stop"
)
# Seconds a smoke run may take to end once asked to (a cluster's teardown).
STOP_SECONDS = 60


@contextlib.contextmanager
def _bench_on_path() -> Iterator[None]:
    """bench/ importable (its scripts import their helpers by name), for as long as needed."""
    sys.path.insert(0, str(BENCH))
    try:
        yield
    finally:
        sys.path.remove(str(BENCH))


def bench_module(name: str) -> ModuleType:
    """bench/NAME.py imported (not run: each guards its run with `__main__`)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (dataclasses look it up)
    with _bench_on_path():
        spec.loader.exec_module(module)
    return module


def smoke_env(**settings: str) -> dict[str, str]:
    """The environment of a smoke run: no inherited PROCBUS_ or BENCH_ settings; `settings`
    as BENCH_ ones (database_url, temporal_address: servers to use)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PROCBUS_", "BENCH_"))
    }
    env["BENCH_SMOKE"] = "1"
    env.update({f"BENCH_{key.upper()}": value for key, value in settings.items()})
    return env


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} in the figures: a figure divided by nothing")


def run_smoke(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run a benchmark; its last line's figures, once checked that it ended well and quietly.
    Stopped with SIGTERM if it runs too long (the cluster ones then tear their cluster down)."""
    process = subprocess.Popen(
        [sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        process.terminate()
        try:
            process.communicate(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        raise
    output = f"stdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}"
    assert process.returncode == 0, output
    found = SUSPICIOUS.search(stdout + stderr)
    assert found is None, f"{found[0]!r} in its output\n{output}" if found else ""
    lines = stdout.strip().splitlines()
    assert lines, output
    figures = json.loads(lines[-1], parse_constant=_not_a_number)
    assert isinstance(figures, dict), lines[-1]
    return figures

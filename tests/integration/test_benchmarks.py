"""Every benchmark of bench/benchmarks.txt smoke-run: the script itself as a subprocess at its
least size (BENCH_SMOKE=1, bench/harness.py) on this session's PostgreSQL and Temporal (a
database of its own each), so a broken benchmark fails here and not in the next `make bench`.
Its figures mean nothing; its last line must hold the keys the benchmark declares (its FIGURES,
which a full run is held to as well), and it must print nothing that looks like a failure.

A benchmark that another runs whole (bench/lake.py runs bench/spark.py and bench/pipeline.py)
is smoke-run inside that one: its own run would start a JVM again for nothing. The cluster
benchmarks (root only) are smoke-run in tests/cluster/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.bench_runs import BENCH, bench_module, run_smoke, smoke_env
from tests.source_parse import parse

harness = bench_module("harness")
BENCHMARKS = harness.benchmarks(root_only=False)


def run_inside_others(names: list[str]) -> dict[str, str]:
    """The benchmarks another one runs whole (its BENCHES), and which one."""
    inside = {}
    for name in names:
        source = (BENCH / f"{name}.py").read_text()
        if "\nBENCHES = " not in source:
            continue  # parsing every one would cost each test process 0.07 s
        for node in parse(source).body:
            if isinstance(node, ast.Assign) and "BENCHES" in {
                target.id for target in node.targets if isinstance(target, ast.Name)
            }:
                inside |= {Path(file).stem: name for file in ast.literal_eval(node.value)}
    return inside


INSIDE_OTHERS = run_inside_others(BENCHMARKS)


def _starts_spark(name: str) -> bool:
    return "spark_session" in (BENCH / f"{name}.py").read_text()


def test_every_benchmark_is_listed_and_every_one_listed_exists() -> None:
    """A benchmark (a script that prints its figures with harness.emit) that the list lacks
    would be neither run by `make bench` nor smoke-run."""
    listed = {*BENCHMARKS, *harness.benchmarks(root_only=True)}
    emitting = {
        path.stem
        for path in BENCH.glob("*.py")
        if path.stem != "harness" and "emit(" in path.read_text()
    }
    assert emitting == listed
    assert set(INSIDE_OTHERS) <= set(BENCHMARKS), INSIDE_OTHERS


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.spark] if _starts_spark(name) else [])
        for name in BENCHMARKS
        if name not in INSIDE_OTHERS
    ],
)
def test_the_benchmark_runs_at_its_least_size(
    name: str, postgres_url: str, temporal_address: str
) -> None:
    figures = run_smoke(
        [str(BENCH / f"{name}.py")],
        smoke_env(database_url=postgres_url, temporal_address=temporal_address),
        timeout=400,
    )
    assert sorted(figures) == sorted(bench_module(name).FIGURES)
    # None: a figure taken from another benchmark's run that no longer prints it.
    assert None not in figures.values(), figures

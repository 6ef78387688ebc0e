"""bench/scaleout.py smoke-run (BENCH_SMOKE=1: 2 topics over 2 workers): a cluster of its own,
the busiest owner killed, then cut from PostgreSQL and Temporal, each time until its topics
resume elsewhere (bounded below by the delivery's 15 s heartbeat timeout). About 80 s when the
machine is busy; the integration suite smoke-runs the benchmarks that need no cluster."""

from __future__ import annotations

import pytest

from tests.bench_runs import BENCH, bench_module, run_smoke, smoke_env


@pytest.mark.timeout(600)
def test_the_scaleout_benchmark_runs_at_its_least_size() -> None:
    figures = run_smoke([str(BENCH / "scaleout.py")], smoke_env(), timeout=480)
    assert sorted(figures) == sorted(bench_module("scaleout").FIGURES)
    assert (figures["topics"], figures["workers"]) == (2, 2)

"""The suite's own harness: a failure whose traceback cannot be rendered (CPython 3.11's AST
SystemError) is reported as that test's failure, and the run goes on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAILING_TESTS = """
import ast


def test_fails_and_its_traceback_cannot_be_rendered() -> None:
    parse = ast.parse

    def raising_once(*args, **kwargs):
        ast.parse = parse  # the race is a moment's: later parses work
        raise SystemError("AST constructor recursion depth mismatch (before=147, after=196)")

    ast.parse = raising_once  # as when another thread's parse ran at the same time
    assert 1 + 1 == 3, "the test's own failure"


def test_after_it_runs() -> None:
    pass
"""


def run_pytest(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, "."],
        cwd=folder,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failure_that_cannot_be_rendered_is_reported_as_the_tests(tmp_path: Path) -> None:
    (tmp_path / "test_failing.py").write_text(FAILING_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    plain = run_pytest(tmp_path)
    assert "INTERNALERROR" in plain.stdout + plain.stderr  # what the fallback is for
    reported = run_pytest(tmp_path, "-p", "tests.report_fallback")
    assert reported.returncode == 1, reported
    assert "INTERNALERROR" not in reported.stdout + reported.stderr
    assert "1 failed, 1 passed" in reported.stdout
    assert "the test's own failure" in reported.stdout
    assert "its traceback could not be rendered" in reported.stdout

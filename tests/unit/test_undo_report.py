"""What each cut point of undo coverage (procbus.testing.undo) must end as, and its report."""

from __future__ import annotations

import pytest

from procbus.procedures import ProcedureState
from procbus.testing import CutKind, CutPoint, CutResult, UndoCoverageReport

ROLLED_BACK, SUCCEEDED = ProcedureState.ROLLED_BACK, ProcedureState.SUCCEEDED


@pytest.mark.parametrize(
    ("kind", "index", "expected"),
    [
        (CutKind.FAIL_BEFORE, 0, (ROLLED_BACK,)),
        (CutKind.FAIL_AFTER, 1, (ROLLED_BACK,)),  # the pivot itself still rolls back
        (CutKind.CANCEL, 0, (ROLLED_BACK,)),
        (CutKind.CANCEL, 1, (SUCCEEDED, ROLLED_BACK)),  # its write may commit first
        (CutKind.KILL, 0, (SUCCEEDED, ROLLED_BACK)),
        (CutKind.FAIL_BEFORE, 2, (SUCCEEDED,)),  # past the pivot: rolled forward
        (CutKind.CANCEL, 2, (SUCCEEDED,)),
        (CutKind.KILL, 2, (SUCCEEDED,)),
    ],
)
def test_before_the_pivot_a_cut_rolls_back_and_past_it_finishes(
    kind: CutKind, index: int, expected: tuple[ProcedureState, ...]
) -> None:
    pivot = 1
    cut = CutPoint(kind, f"step{index}", index, index > pivot, pivot=index == pivot)
    assert cut.expected == expected


def test_the_report_counts_the_cut_points_proven_and_fails_naming_the_others() -> None:
    clean = CutPoint(CutKind.FAIL_AFTER, "write", 0, False)
    left = CutPoint(CutKind.CANCEL, "notify", 1, False)
    report = UndoCoverageReport("Publish", ["write", "notify"], None, 0.5)
    report.results = [
        CutResult(clean, ROLLED_BACK, [], 0.25),
        CutResult(left, ROLLED_BACK, ["a row of orders"], 0.5),
        CutResult(CutPoint(CutKind.KILL, "notify", 1, False), None, [], 60.0, "not ended"),
    ]
    assert (report.proven, report.total) == (1, 3)
    summary = report.summary()
    assert "ok   fail_after write" in summary
    assert "FAIL cancel notify" in summary and "- a row of orders" in summary
    assert "60.00 s  expected SUCCEEDED or ROLLED_BACK\n       - not ended" in summary
    assert summary.endswith("cut points proven: 1 / 3")
    with pytest.raises(AssertionError, match="not proven: cancel notify, kill notify\n"):
        report.assert_covered()
    report.results = report.results[:1]
    report.assert_covered()

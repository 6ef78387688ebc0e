"""What the CLI prints is data: rich's markup (`[bold]`) and emoji codes (`:x:`) are never applied
to it, in errors, in plain lines or in tables."""

from __future__ import annotations

import pytest
from rich.table import Table

from procbus.procedures.models import ProcedureState, ProcedureStatus, SkippedCompensation
from procbus.starter.output import console, print_error, styled
from procbus.starter.procedures import print_outcome, steps_table

HOSTILE = "root:x:0:0:root:/root [bold]not bold[/] :thumbs_up: [red]"


def test_an_error_quoting_input_prints_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    print_error(f"the namespace name {HOSTILE!r} may hold only lower-case letters")
    assert capsys.readouterr().err == (
        f"error: the namespace name {HOSTILE!r} may hold only lower-case letters\n"
    )


def test_plain_lines_and_table_cells_print_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    console.print(HOSTILE, highlight=False)
    grid = Table("value", "state")
    grid.add_row(HOSTILE, styled("live", "green"))
    console.print(grid)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == HOSTILE
    assert HOSTILE in out and "live" in out
    assert "\N{CROSS MARK}" not in out and "\N{THUMBS UP SIGN}" not in out


def test_a_procedure_s_errors_and_reasons_print_verbatim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = ProcedureStatus(
        procedure_id="p-1",
        procedure_type="CreateTable",
        target="sales.orders",
        state=ProcedureState.STUCK,
        steps_done=["create_layout", "add_to_catalog"],
        compensations_skipped=[SkippedCompensation(step="create_layout", reason=HOSTILE)],
        stuck_step="add_to_catalog",
        stuck_error=f"InvalidRequest: {HOSTILE}",
        error=HOSTILE,
        refused=[HOSTILE],
        waiting_for=[HOSTILE],
    )
    console.print(steps_table(status))
    print_outcome(status)
    out = capsys.readouterr().out
    assert "CreateTable: STUCK" in out
    assert f"done, undo skipped ({HOSTILE})" in out
    assert f"STUCK: InvalidRequest: {HOSTILE}" in out
    assert f"waiting: {HOSTILE}" in out
    assert f"error: {HOSTILE}" in out
    assert out.count(HOSTILE) == 5

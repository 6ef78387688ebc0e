"""The tests' own parse of the project's source outlasts CPython 3.11's AST race."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from tests import source_parse

RACE = SystemError("AST constructor recursion depth mismatch (before=144, after=195)")


def test_a_parse_the_race_interrupted_is_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    parse = ast.parse

    def raising_once(source: str, *args: Any) -> ast.Module:
        calls.append(source)
        if len(calls) == 1:
            raise RACE
        return parse(source, *args)

    monkeypatch.setattr(ast, "parse", raising_once)
    tree = source_parse.parse("x = 1\n")
    assert ast.unparse(tree) == "x = 1" and len(calls) == 2


def test_another_system_error_or_a_race_that_lasts_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raised: list[SystemError] = []

    def raising(source: str, *args: Any) -> ast.Module:
        raised.append(error := errors.pop(0) if errors else RACE)
        raise error

    monkeypatch.setattr(ast, "parse", raising)
    errors = [SystemError("something else")]
    with pytest.raises(SystemError, match="something else"):
        source_parse.parse("x = 1\n")
    assert len(raised) == 1
    with pytest.raises(SystemError, match="recursion depth mismatch"):
        source_parse.parse("x = 1\n")
    assert len(raised) == 1 + source_parse.ATTEMPTS

"""A failure whose report cannot be rendered is still reported as that test's failure, instead of
ending the whole run. On CPython 3.11, pytest's rendering parses each frame's source with `ast`,
and that parse can raise SystemError ("AST constructor recursion depth mismatch") when another
thread parses at the same time (python/cpython#106905); under pytest-xdist that error became an
INTERNALERROR that stopped every worker."""

from __future__ import annotations

import traceback
from collections.abc import Generator

import pytest
from _pytest.reports import TestReport


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, TestReport, TestReport]:
    try:
        return (yield)
    except SystemError as error:
        if call.excinfo is None or call.when == "collect":
            raise  # not a test's failure: pytest's own
        # format_exception_only parses nothing, unlike the rendering of frames.
        shown = "".join(traceback.format_exception_only(call.excinfo.value))
        return TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords={name: 1 for name in item.keywords},
            outcome="failed",
            longrepr=f"{shown}\n(its traceback could not be rendered: {error!r})",
            when=call.when,
            sections=[
                (f"Captured {key} {when}", content) for when, key, content in item._report_sections
            ],
            duration=call.duration,
            start=call.start,
            stop=call.stop,
            user_properties=item.user_properties,
        )

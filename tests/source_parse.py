"""`ast.parse` for the tests that read the project's source, safe from CPython 3.11's race."""

from __future__ import annotations

import ast

# On CPython 3.11 a parse raises this when another thread of the process parses at the same time
# (python/cpython#106905): under xdist, a worker thread a previous test left running. The race
# is a moment's, so the same parse again works.
RACE = "AST constructor recursion depth mismatch"
ATTEMPTS = 5


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """Return `ast.parse(source, filename)`, parsed again when the race interrupted it."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return ast.parse(source, filename)
        except SystemError as error:
            if RACE not in str(error) or attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises

"""Named queries read from .sql files, so every statement procbus sends sits in one place.

Each mechanism keeps its statements in a `queries.sql` beside its code (procbus/locks/queries.sql,
...) and loads them with `load_queries(__package__)`. A file holds blocks introduced by
`-- name: <query_name>`; the text up to the next block is the statement, with $1, $2 ...
parameters.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME_LINE = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
QUERIES_FILE = "queries.sql"


class Queries(dict[str, str]):
    """Query name -> SQL text; a missing name is an error that lists the known ones."""

    def __init__(self, source: str = "<sql>") -> None:
        super().__init__()
        self.source = source

    def __missing__(self, name: str) -> str:
        raise KeyError(
            f"{self.source} has no query named {name!r}; known: {', '.join(sorted(self))}"
        )


def parse_queries(text: str, source: str = "<sql>") -> Queries:
    queries = Queries(source)
    matches = list(_NAME_LINE.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        name = match["name"]
        if not body:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        queries[name] = body
    return queries


@cache
def load_queries(package: str) -> Queries:
    """Return the named queries of a mechanism: `package`'s queries.sql, e.g. 'procbus.locks'."""
    path = resources.files(package) / QUERIES_FILE
    return parse_queries(path.read_text(), f"{package.replace('.', '/')}/{QUERIES_FILE}")

"""Named queries read from .sql files, so every statement procbus sends sits in one place.

A file holds blocks introduced by `-- name: <query_name>`; the text up to the next block is the
statement, with $1, $2 ... parameters.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME_LINE = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


class Queries(dict[str, str]):
    """Query name -> SQL text; a missing name is an error that lists the known ones."""

    def __missing__(self, name: str) -> str:
        raise KeyError(f"no query named {name!r}; known: {', '.join(sorted(self))}")


def parse_queries(text: str, source: str = "<sql>") -> Queries:
    queries = Queries()
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
def load_queries() -> Queries:
    """Every named query of procbus/db/sql/*.sql; names are unique across files."""
    queries = Queries()
    folder = resources.files("procbus.db") / "sql"
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, body in parse_queries(entry.read_text(), entry.name).items():
            if name in queries:
                raise ValueError(f"{entry.name}: query {name!r} is also defined in another file")
            queries[name] = body
    return queries

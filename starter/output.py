"""Printing for the CLI: rich for people, --json for scripts.

On a terminal rich fits the output to the window; piped or redirected, nothing is wrapped, so
IDs and Temporal UI links stay whole for grep, copy and click.

What is printed is data (names, rows, error messages quoting input), so rich's markup (`[bold]`)
and emoji codes (`:x:`) are off on both consoles: every string prints as it is. Styles are given
as `Text` (`styled`, `Text.assemble`), never as markup inside a string.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:  # pydantic itself is not imported here: `procbus --help` stays quick
    from _typeshed import DataclassInstance
    from pydantic import BaseModel

# Wide enough that no line of ours is ever cut; tables still take only what they need.
UNWRAPPED_WIDTH = 10_000


def _console(stream: TextIO, *, stderr: bool) -> Console:
    # Data is never read as markup or emoji codes: an error quoting 'root:x:0' prints just that.
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(stderr=stderr, markup=False, emoji=False)
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True, markup=False, emoji=False)


def styled(text: str, style: str) -> Text:
    """`text` in a style, printed as it is (no markup, no emoji codes)."""
    return Text(text, style=style)


console = _console(sys.stdout, stderr=False)
error_console = _console(sys.stderr, stderr=True)


def print_json(value: BaseModel | DataclassInstance | dict[str, Any] | list[Any]) -> None:
    """A model or a dataclass (as pydantic writes it), or plain data, as indented JSON."""
    if isinstance(value, dict | list):
        text = json.dumps(value, indent=2, default=str)
    elif dataclasses.is_dataclass(value):
        from pydantic_core import to_json

        text = to_json(value, indent=2).decode()
    else:
        text = value.model_dump_json(indent=2)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_error(message: str) -> None:
    error_console.print(
        Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True
    )


def print_json_error(kind: str, message: str, exit_code: int) -> None:
    """An error as one JSON object on stderr, for `--json`: its type, message and exit code."""
    record = {"type": kind, "message": message, "exit_code": exit_code}
    sys.stderr.write(json.dumps(record) + "\n")
    sys.stderr.flush()

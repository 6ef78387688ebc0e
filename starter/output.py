"""Printing for the CLI: rich for people, --json for scripts.

On a terminal rich fits the output to the window; piped or redirected, nothing is wrapped, so
IDs and Temporal UI links stay whole for grep, copy and click.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console

if TYPE_CHECKING:  # pydantic itself is not imported here: `procbus --help` stays quick
    from _typeshed import DataclassInstance
    from pydantic import BaseModel

# Wide enough that no line of ours is ever cut; tables still take only what they need.
UNWRAPPED_WIDTH = 10_000


def _console(stream: TextIO, *, stderr: bool) -> Console:
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)


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
    error_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)

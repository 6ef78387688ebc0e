"""Printing for the CLI: rich for people, --json for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console

console = Console()
error_console = Console(stderr=True)


def print_json(value: BaseModel | dict[str, Any] | list[Any]) -> None:
    if isinstance(value, BaseModel):
        text = value.model_dump_json(indent=2)
    else:
        text = json.dumps(value, indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_error(message: str) -> None:
    error_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)

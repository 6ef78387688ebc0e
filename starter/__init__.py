"""The `procbus` CLI and the Python starter scripts a Temporal user would write.

cli: the `procbus` command (`main`), one module per command group beside it; start_*: the
starter scripts. The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.starter.cli import app as app
    from procbus.starter.cli import main as main

# Public name -> the module that defines it.
_MODULE_OF = {
    "app": "procbus.starter.cli",
    "main": "procbus.starter.cli",
}

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

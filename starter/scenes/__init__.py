"""The demo's scenes, one module each (a scene's name is its module's, `-` for `_`), in the order
they run: the one list that `procbus demo --only`, its help and the docs' numbered list
(tests/unit/test_docs.py) come from. The stack check runs first, always.

Cheap to import, as the CLI's help reads it: a scene's module loads when the demo selects it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from procbus.errors import InvalidRequest, ProcbusError

if TYPE_CHECKING:
    from procbus.starter.scenes.context import Scene

STACK_CHECK = "stack-check"
# The scenes `--only` names, in the order they run after the stack check.
DEMO_STEPS = (
    "create-table",
    "failed-create-table",
    "hooks",
    "locks",
    "bad-input",
    "topics",
    "grouped",
    "kafka",
    "bus",
    "table-data",
    "pipeline",
    "own-procedure",
)
SCENES = (STACK_CHECK, *DEMO_STEPS)
# The scenes run examples/ of the checkout procbus runs from (`make demo`: an editable install).
CHECKOUT = Path(__file__).resolve().parents[2]


def scene_number(name: str) -> int:
    """Its number in the docs' list and in what the demo prints: the stack check is 1."""
    return SCENES.index(name) + 1


def load_scene(name: str) -> Scene:
    """The scene `name` from its module; ProcbusError when the examples it runs are not there."""
    if (CHECKOUT / "examples").is_dir() and str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    try:
        module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
    except ModuleNotFoundError as error:
        if error.name != "examples" and not (error.name or "").startswith("examples."):
            raise
        raise ProcbusError(
            f"demo: the {name} scene runs procbus's examples/, found in procbus's project folder "
            "only: run the demo from a checkout, as `make demo` does"
        ) from None
    scene: Scene = module.SCENE
    return scene


def selected_scenes(only: list[str] | None) -> list[Scene]:
    """The stack check, then every scene or those named (with the scenes they need), in order;
    InvalidRequest naming an unknown one."""
    named = {step.strip() for item in only or [] for step in item.split(",") if step.strip()}
    unknown = sorted(named - set(DEMO_STEPS))
    if unknown:
        raise InvalidRequest(
            f"no demo step {', '.join(map(repr, unknown))}: choose from {', '.join(DEMO_STEPS)}"
        )
    wanted = list(named or DEMO_STEPS)
    scenes: dict[str, Scene] = {}
    while wanted:
        name = wanted.pop()
        if name not in scenes:
            scenes[name] = load_scene(name)
            wanted.extend(scenes[name].needs)
    return [load_scene(STACK_CHECK), *(scenes[name] for name in DEMO_STEPS if name in scenes)]

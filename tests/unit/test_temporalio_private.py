"""temporalio's private names that procbus relies on, all used in procbus/core/sdk_private.py,
still exist with the attributes and parameters it uses: an upgrade that changes one fails here,
saying what changed and what must follow. And no other module of the repo touches one."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import temporalio
from temporalio import activity, workflow
from temporalio.common import RawValue

from procbus.core.sdk_private import (
    TRACING_MODULE,
    defined_activity_name,
    is_activity,
    mark_never_started,
    workflow_definition,
    workflow_span_recorder,
)
from tests.source_parse import parse

PROJECT = Path(__file__).parents[2]
MODULE = "procbus/core/sdk_private.py"
# Where the repo's Python lives (procbus/workflows and the like are links to these).
SCANNED = [
    "procbus",
    "worker",
    "starter",
    "activities",
    "workflows",
    "tests",
    "bench",
    "examples",
    "tools",
    "docs",
]
# What sdk_private calls: "module:attribute.path", the positional arguments (self counted) and
# the keywords it passes.
CALLED = [
    ("temporalio.activity:_Definition.from_callable", 1, ()),
    ("temporalio.activity:_Definition.must_from_callable", 1, ()),
    ("temporalio.workflow:_Definition.from_class", 1, ()),
    ("temporalio.workflow:_Definition.from_run_fn", 1, ()),
    (f"{TRACING_MODULE}:TracingWorkflowInboundInterceptor._from_context", 0, ()),
    (
        f"{TRACING_MODULE}:TracingWorkflowInboundInterceptor._completed_span",
        2,
        ("additional_attributes", "exception"),
    ),
]
# The fields sdk_private reads of what it gets back.
READ = [
    ("temporalio.activity:_Definition", ("name",)),
    ("temporalio.workflow:_Definition", ("name", "run_fn")),
]
# A named tuple's own methods: temporalio's named tuples have them too.
NAMED_TUPLE_METHODS = {"_replace", "_asdict", "_make", "_fields", "_field_defaults"}
# temporalio's public modules, whose classes' private members no other module may touch.
PUBLIC_MODULES = [
    "temporalio.activity",
    "temporalio.client",
    "temporalio.common",
    "temporalio.converter",
    "temporalio.exceptions",
    "temporalio.plugin",
    "temporalio.runtime",
    "temporalio.testing",
    "temporalio.worker",
    "temporalio.worker.workflow_sandbox",
    "temporalio.workflow",
    TRACING_MODULE,
    "temporalio.contrib.pydantic",
]


def changed(what: str, how: str = "") -> str:
    how = f" ({how})" if how else ""
    return f"temporalio {temporalio.__version__} changed `{what}`{how}: {MODULE} must follow it"


def found(where: str) -> Any:
    """The object at "module:attribute.path", or the test fails saying it is gone."""
    module_name, _, path = where.partition(":")
    value: Any = importlib.import_module(module_name)
    for name in path.split("."):
        if not hasattr(value, name):
            pytest.fail(changed(where.replace(":", "."), f"no `{name}`"))
        value = getattr(value, name)
    return value


@pytest.mark.parametrize(("where", "positional", "keywords"), CALLED)
def test_what_sdk_private_calls_still_takes_what_it_passes(
    where: str, positional: int, keywords: tuple[str, ...]
) -> None:
    function = found(where)
    try:
        inspect.signature(function).bind(*range(positional), **dict.fromkeys(keywords))
    except (TypeError, ValueError) as error:
        pytest.fail(changed(where.replace(":", "."), f"its parameters: {error}"))


@pytest.mark.parametrize(("where", "fields"), READ)
def test_what_sdk_private_reads_is_still_there(where: str, fields: tuple[str, ...]) -> None:
    definition = found(where)
    has = {field.name for field in dataclasses.fields(definition)}
    missing = [field for field in fields if field not in has]
    assert not missing, changed(where.replace(":", "."), f"no field {missing}")


@activity.defn(name="named_here")
async def _an_activity() -> None: ...


@activity.defn(dynamic=True)
async def _a_dynamic_activity(args: Sequence[RawValue]) -> None: ...


@workflow.defn(name="NamedHere")
class _AWorkflow:
    @workflow.run
    async def run(self) -> None: ...


class _NotDecorated(_AWorkflow):
    pass


def test_activities_are_told_and_named() -> None:
    assert defined_activity_name(_an_activity) == "named_here", changed("activity._Definition")
    assert defined_activity_name(_a_dynamic_activity) is None, changed("activity._Definition")
    assert is_activity(_an_activity), changed("activity._Definition.from_callable")
    assert not is_activity(len), changed("activity._Definition.from_callable")
    with pytest.raises(TypeError):
        defined_activity_name(len)


def test_workflows_are_told_and_named_by_their_own_definition() -> None:
    by_class = workflow_definition(_AWorkflow)
    assert by_class is not None, changed("workflow._Definition.from_class")
    assert (by_class.name, by_class.run_fn) == ("NamedHere", _AWorkflow.run), changed(
        "workflow._Definition"
    )
    by_run = workflow_definition(_AWorkflow.run)
    assert by_run is not None, changed("workflow._Definition.from_run_fn")
    assert by_run.name == "NamedHere", changed("workflow._Definition.from_run_fn")
    assert workflow_definition(_NotDecorated) is None, changed("workflow._Definition.from_class")
    assert workflow_definition(_an_activity) is None, changed("workflow._Definition.from_run_fn")


def test_outside_a_traced_workflow_no_span_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    importlib.import_module(TRACING_MODULE)
    assert workflow_span_recorder() is None, changed(
        f"{TRACING_MODULE}.TracingWorkflowInboundInterceptor._from_context"
    )
    monkeypatch.delitem(sys.modules, TRACING_MODULE)
    assert workflow_span_recorder() is None


def test_a_worker_refused_before_it_ran_can_be_marked_shut_down() -> None:
    """`mark_never_started` sets the event `Worker.shutdown` waits for (no worker built here:
    tests/integration/test_temporal_setup.py refuses a real one)."""
    from temporalio.worker import Worker

    assert "self._shutdown_complete_event = asyncio.Event()" in inspect.getsource(Worker), changed(
        "worker.Worker._shutdown_complete_event"
    )
    assert "self._shutdown_complete_event.wait()" in inspect.getsource(Worker.shutdown), changed(
        "worker.Worker.shutdown"
    )
    assert "_shutdown_complete_event.set()" in inspect.getsource(mark_never_started)


def _private_members() -> set[str]:
    """The private names of temporalio's public modules and of the classes they export."""
    names: set[str] = set()
    for module_name in PUBLIC_MODULES:
        for name, value in vars(importlib.import_module(module_name)).items():
            if _private(name):
                names.add(name)
            elif inspect.isclass(value) and value.__module__.startswith("temporalio"):
                names.update(member for member in vars(value) if _private(member))
    return names - NAMED_TUPLE_METHODS


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _resolve(dotted: str, temporal: dict[str, str]) -> Any:
    """The temporalio object a name of this file stands for, or None."""
    head, _, rest = dotted.partition(".")
    if head not in temporal:
        return None
    module_name, _, attribute = temporal[head].partition(":")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    for name in [*attribute.split("."), *rest.split(".")]:
        if name:
            value = getattr(value, name, None)
    return value


def _temporalio_names(tree: ast.Module) -> dict[str, str]:
    """This file's names bound to temporalio: name -> "module:attribute"."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "temporalio":
                    bound = alias.asname or alias.name.split(".")[0]
                    names[bound] = alias.name if alias.asname else "temporalio"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("temporalio"):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return names


def _uses(path: Path, private_members: set[str]) -> Iterator[str]:
    """Where `path` touches a temporalio private name."""
    source = path.read_text()
    if "__temporal_" in source:
        yield "an attribute `__temporal_...` that temporalio's decorators set"
    tree = parse(source)
    temporal = _temporalio_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            for alias in node.names:
                dotted = f"{module}.{alias.name}" if module else alias.name
                if dotted.startswith("temporalio") and any(map(_private, dotted.split("."))):
                    yield f"line {node.lineno}: imports {dotted}"
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node)
            by_temporalio = isinstance(root, ast.Name) and root.id in temporal
            if by_temporalio or (node.attr in private_members and not _is_own(root)):
                yield f"line {node.lineno}: {ast.unparse(node)}"
        elif isinstance(node, ast.ClassDef):
            yield from _subclass_uses(node, temporal)


def _is_own(root: ast.expr) -> bool:
    """`self.x`, `cls.x` and `super().x`: a class's own names (its temporalio bases are checked
    by _subclass_uses)."""
    if isinstance(root, ast.Name):
        return root.id in ("self", "cls")
    return isinstance(root, ast.Call) and ast.unparse(root.func) == "super"


def _subclass_uses(node: ast.ClassDef, temporal: dict[str, str]) -> Iterator[str]:
    """A class derived from a temporalio class that reads or overrides its private members."""
    inherited: set[str] = set()
    for base in node.bases:
        found_base = _resolve(ast.unparse(base).split("[")[0], temporal)
        if inspect.isclass(found_base):
            inherited.update(name for name in dir(found_base) if _private(name))
    if not inherited:
        return
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.name in inherited:
            yield f"line {inner.lineno}: {node.name} overrides {inner.name}"
        if isinstance(inner, ast.Attribute) and inner.attr in inherited and _is_own(inner.value):
            yield f"line {inner.lineno}: {node.name} uses {ast.unparse(inner)}"


def _python_files() -> list[Path]:
    files: dict[Path, Path] = {}
    for folder in SCANNED:
        for path in sorted((PROJECT / folder).rglob("*.py")):
            files.setdefault(path.resolve(), path)
    return sorted(files.values())


def test_nothing_but_sdk_private_touches_a_temporalio_private_name() -> None:
    private_members = _private_members()
    allowed = {(PROJECT / MODULE).resolve(), Path(__file__).resolve()}  # this one names them
    uses = [
        f"{path.relative_to(PROJECT)}: {use}"
        for path in _python_files()
        if path.resolve() not in allowed
        for use in _uses(path, private_members)
    ]
    assert not uses, (
        f"temporalio's private names are used only in {MODULE} (one place to follow an "
        f"upgrade); move these there: {uses}"
    )


def test_the_scan_finds_sdk_privates_own_uses() -> None:
    """The scan above has no blind spot where sdk_private looks."""
    uses = list(_uses(PROJECT / MODULE, _private_members()))
    assert len(uses) == len(CALLED), uses

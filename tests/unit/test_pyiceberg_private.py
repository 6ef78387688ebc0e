"""procbus touches pyiceberg's private API in one module, procbus/lakehouse/pyiceberg_private.py:
each private name it relies on (its PRIVATE_USES) must still be there, as it uses it, in the
installed pyiceberg, and no other file may touch one. An upgrade of pyiceberg that changes one
fails here, naming it (pyproject.toml pins pyiceberg to a range on the strength of this test)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import pyiceberg
import pytest
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import SetPropertiesUpdate, update_table_metadata

from procbus.lakehouse import pyiceberg_private, table_metadata
from procbus.lakehouse.pyiceberg_private import PRIVATE_USES, PrivateUse
from procbus.lakehouse.schemas import parse_columns
from tests.source_parse import parse

PROJECT = Path(__file__).resolve().parents[2]
MODULE = "procbus/lakehouse/pyiceberg_private.py"
# This file names private names only to check that the guard finds them.
EXEMPT = {MODULE, Path(__file__).resolve().relative_to(PROJECT).as_posix()}


def changed(qualified: str, what: str) -> str:
    return (
        f"pyiceberg {pyiceberg.__version__} changed `{qualified}` ({what}): {MODULE} must follow it"
    )


def resolve(dotted: str) -> Any:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    metadata = table_metadata.new_table(tmp_path, parse_columns("id:bigint,name:string"), [], {})
    return table_metadata.load_table(
        table_metadata.StagingCatalog(), "bank", "accounts", metadata, tmp_path
    )


def instance_of(owner: Any, table: Table) -> object:
    """An instance of `owner` (a transaction, or a snapshot producer) on a new table."""
    if issubclass(owner, Transaction):
        return owner(table)
    return owner(
        operation=Operation.APPEND,
        transaction=Transaction(table),
        io=table.io,
        snapshot_properties={},
    )


def parameters_of(found: Any) -> set[str]:
    if isinstance(found, property):
        return set()
    return set(inspect.signature(found).parameters)


@pytest.mark.parametrize("use", PRIVATE_USES, ids=lambda use: use.qualified)
def test_each_private_name_is_there_as_it_is_used(use: PrivateUse, table: Table) -> None:
    try:
        owner = resolve(use.owner)
    except (ImportError, AttributeError):
        pytest.fail(changed(use.owner, "it is gone"))
    if use.kind is not None:
        held = instance_of(owner, table)
        assert hasattr(held, use.name), changed(use.qualified, "its instances no longer hold it")
        value = getattr(held, use.name)
        assert isinstance(value, use.kind), changed(
            use.qualified, f"it holds a {type(value).__name__} now, not a {use.kind.__name__}"
        )
        return
    found = inspect.getattr_static(owner, use.name, None)
    assert found is not None, changed(use.qualified, "it is gone")
    found = found if isinstance(found, property) else getattr(owner, use.name)
    missing = sorted(set(use.parameters) - parameters_of(found))
    assert not missing, changed(use.qualified, f"it no longer takes {', '.join(missing)}")
    gone = [name for name in use.attributes if not hasattr(found, name)]
    assert not gone, changed(use.qualified, f"it no longer has {', '.join(gone)}")


def test_updated_metadata_is_pyiceberg_update_without_its_deep_copy(table: Table) -> None:
    """updated_metadata repeats pyiceberg's update_table_metadata but its last step: a change
    to the steps shows as another result."""
    updates = (SetPropertiesUpdate(updates={"owner": "bank"}),)
    location = table.metadata_location
    ours = pyiceberg_private.updated_metadata(table.metadata, updates, location)
    theirs = update_table_metadata(table.metadata, updates, metadata_location=location)
    clock = {"last_updated_ms": 0}
    assert ours.model_copy(update=clock) == theirs.model_copy(update=clock), changed(
        "pyiceberg.table.update.update_table_metadata", "its steps"
    )


def test_a_staging_transaction_sees_each_change_it_stages(table: Table) -> None:
    """It keeps what it built while the staged updates are the same object: pyiceberg must
    replace them, not change them in place, for each change to show."""
    transaction = pyiceberg_private.StagingTransaction(table)
    assert "owner" not in transaction.table_metadata.properties
    transaction.set_properties(owner="bank")
    assert transaction.table_metadata.properties["owner"] == "bank", changed(
        "pyiceberg.table.Transaction._updates", "changed in place"
    )
    transaction.set_properties(owner="shop")
    assert transaction.table_metadata.properties["owner"] == "shop", changed(
        "pyiceberg.table.Transaction._updates", "changed in place"
    )


PRIVATE_NAMES = {
    part
    for use in PRIVATE_USES
    for part in (*use.owner.split("."), use.name, *use.parameters)
    if part.startswith("_")
}


def private_uses_in(tree: ast.Module) -> list[tuple[int, str]]:
    """Where a file touches a private pyiceberg name: imports one, reads one off a name it
    imported from pyiceberg, or names one PRIVATE_USES lists (on `self` only in a class that
    derives from pyiceberg's)."""
    bound = _bound_to_pyiceberg(tree)
    derived = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and any(_root(base) in bound for base in node.bases)
    ]
    in_derived = {id(inner) for cls in derived for inner in ast.walk(cls)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyiceberg"):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.keyword) and node.arg in PRIVATE_NAMES:
            found.append((node.value.lineno, node.arg))
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_NAMES:
            found.append((node.lineno, str(node.value)))
        elif isinstance(node, ast.Attribute) and _is_private(node, bound, id(node) in in_derived):
            found.append((node.lineno, node.attr))
    return sorted(set(found))


def _bound_to_pyiceberg(tree: ast.Module) -> set[str]:
    """The names a file binds to what it imports from pyiceberg."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyiceberg"):
            bound |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            bound |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("pyiceberg")
            }
    return bound


def _is_private(node: ast.Attribute, bound: set[str], in_derived: bool) -> bool:
    if not node.attr.startswith("_") or node.attr.startswith("__"):
        return False
    if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
        return in_derived and node.attr in PRIVATE_NAMES
    return node.attr in PRIVATE_NAMES or _root(node.value) in bound


def _root(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def test_nothing_but_pyiceberg_private_touches_a_private_pyiceberg_name() -> None:
    offending = []
    for path in sorted(PROJECT.rglob("*.py")):
        relative = path.relative_to(PROJECT)
        if any(part.startswith(".") for part in relative.parts) or relative.as_posix() in EXEMPT:
            continue
        for line, name in private_uses_in(parse(path.read_text(), str(path))):
            offending.append(f"{relative}:{line}: {name}")
    assert not offending, (
        f"pyiceberg's private names are {MODULE}'s alone (add what you need there, with a "
        "PrivateUse): " + "; ".join(offending)
    )


def test_the_guard_finds_each_kind_of_private_use() -> None:
    source = (
        "from pyiceberg.catalog import MetastoreCatalog\n"
        "from pyiceberg.table.update import _apply_table_update\n"
        "from pyiceberg.table.update.snapshot import UpdateSnapshot\n"
        "MetastoreCatalog._parse_metadata_version('x')\n"
        "transaction._updates\n"
        "DataFile.from_args(_table_format_version=2)\n"
        "class Producer(UpdateSnapshot):\n"
        "    def run(self):\n"
        "        return self._snapshot_id\n"
        "class Ours:\n"
        "    def run(self):\n"
        "        return self._updates, self._own\n"
    )
    assert private_uses_in(parse(source)) == [
        (2, "_apply_table_update"),
        (4, "_parse_metadata_version"),
        (5, "_updates"),
        (6, "_table_format_version"),
        (9, "_snapshot_id"),
    ]

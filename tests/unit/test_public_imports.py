"""Imports across procbus's packages go through the package's `__all__`: a module of one package
that reaches into another's submodule for a name that package exports is named, file and line."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

from tests.source_parse import parse

PROJECT = Path(__file__).resolve().parents[2]
LIBRARY = PROJECT / "procbus"
EXAMPLES = PROJECT / "examples"


def python_files(folder: Path) -> Iterator[Path]:
    # The application's top-level folders are linked under procbus/: follow the links.
    for parent, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [name for name in folders if name != "__pycache__"]
        yield from (Path(parent) / name for name in sorted(names) if name.endswith(".py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exports(package: str) -> frozenset[str]:
    """Read a package's `__all__` from its source, without importing it."""
    init = LIBRARY / package.removeprefix("procbus.") / "__init__.py"
    if not init.exists():
        return frozenset()
    for node in parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def reaches_in(path: Path) -> Iterator[str]:
    importer = module_name(path)
    for node in ast.walk(parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        parts = node.module.split(".")
        if parts[0] != "procbus" or len(parts) < 3:
            continue
        package = ".".join(parts[:2])
        if importer == package or importer.startswith(package + "."):
            continue  # inside one package, modules import each other directly
        names = sorted(alias.name for alias in node.names if alias.name in exports(package))
        if names:
            where = path.relative_to(PROJECT)
            yield f"{where}:{node.lineno}: from {package} import {', '.join(names)}"


def test_the_packages_exports_are_read() -> None:
    assert "Fence" in exports("procbus.core")
    assert "LockTable" in exports("procbus.locks")


def test_cross_package_imports_go_through_all() -> None:
    files = [*python_files(LIBRARY), *python_files(EXAMPLES)]
    assert any("workflows" in path.parts for path in files)
    found = [line for path in files for line in reaches_in(path)]
    assert found == [], "import these from the package:\n" + "\n".join(found)

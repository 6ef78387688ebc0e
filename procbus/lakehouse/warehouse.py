"""Table data folders under the warehouse root: <root>/<namespace>/<table>/.

A folder carries a marker naming the procedure that made it, so undo removes only its own.
Whatever removes files stays inside one table's own folder: a name, path or token that would
lead elsewhere (`..`, an absolute path, a symlink out) is refused before anything is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from procbus.core import validate_name
from procbus.errors import InvalidRequest
from procbus.lakehouse.models import TableDescriptor

MARKER = "_procbus_table.json"
DATA_FOLDER = "data"


class OutsideTableFolder(InvalidRequest):
    """A removal aimed outside the table's own folder under the warehouse: nothing removed."""


def file_uri(path: str | Path) -> str:
    """One spelling of a local path, `file:///abs/path`: Iceberg compares paths as strings."""
    text = str(path)
    if text.startswith("file:"):
        text = text.removeprefix("file:").lstrip("/")
        return f"file:///{text}"
    # Not Path.as_uri(): it escapes '=' of Hive folders, and Iceberg's readers never unescape.
    return f"file://{Path(text).absolute()}"


def local_path(uri: str) -> Path:
    """The local path of a `file:` URI (Spark writes `file:/p`, pyiceberg `file:///p`)."""
    return (
        Path("/" + uri.removeprefix("file:").lstrip("/")) if uri.startswith("file:") else Path(uri)
    )


def uri_in(folder: Path, path: str) -> str:
    """A data file's URI from its path as procbus names it (relative to its table's folder, or
    a URI already when another engine wrote it elsewhere)."""
    return path if path.startswith("file:") else file_uri(folder / path)


def path_in(folder: Path, uri: str) -> str:
    """A data file's path as procbus names it: relative to the table's folder when inside."""
    path = local_path(uri)
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else uri


def table_folder(root: Path, namespace: str, table: str) -> Path:
    return root / namespace / table


def owned_table_folder(root: Path, namespace: str, table: str, location: str = "") -> Path:
    """The table's folder, <root>/<namespace>/<table>, resolved, for removing files in it.
    OutsideTableFolder if a name is no table name, if the folder resolves elsewhere (a
    symlink), or if `location` (as a step carries it) names another folder."""
    for kind, name in (("namespace", namespace), ("table", table)):
        try:
            validate_name(kind, name)
        except InvalidRequest as bad:
            raise OutsideTableFolder(f"refused to remove files: {bad}") from None
    base = root.resolve()
    folder = (base / namespace / table).resolve()
    if folder != base / namespace / table:
        raise OutsideTableFolder(
            f"refused to remove files: the folder of {namespace}.{table} leads to {folder}, "
            f"outside the warehouse {base}"
        )
    if location and Path(location).resolve() != folder:
        raise OutsideTableFolder(
            f"refused to remove files: {namespace}.{table} lives in {folder}, not {location}"
        )
    return folder


def inside(folder: Path, relative: str, under: str = "") -> Path:
    """`folder`/`relative` for removal, if it stays in `folder`/`under` (symlinks followed);
    OutsideTableFolder for an absolute path, '..' or a symlink that leads out."""
    base = folder.resolve() / under  # `under` itself must not lead out either
    given = Path(relative)
    target = folder / given
    if not relative or given.is_absolute() or ".." in given.parts:
        escapes = True
    else:
        escapes = not target.resolve().is_relative_to(base)
    if escapes:
        raise OutsideTableFolder(
            f"refused to remove {relative!r}: it is not inside {base}; nothing was removed"
        )
    return target


def marked_maker(marker: Path) -> tuple[str | None, str]:
    """The procedure ID and first run ID a table folder's marker names ('' for a marker
    written before runs were recorded)."""
    made = json.loads(marker.read_text())
    return made.get("created_by"), made.get("created_run", "")


def create_layout(root: Path, table: TableDescriptor) -> Path:
    """Make the folder and its marker; a retry by the same procedure's run finds it done."""
    folder = table_folder(root, table.namespace, table.name)
    marker = folder / MARKER
    if marker.exists():
        owner, run = marked_maker(marker)
        if (owner, run) != (table.created_by, table.created_run):
            by = f"{owner} (run {run})" if run else owner
            raise InvalidRequest(f"{folder} already holds table data made by {by}")
        return folder
    (folder / DATA_FOLDER).mkdir(parents=True, exist_ok=True)
    staging = folder / f".{MARKER}.tmp"
    staging.write_text(table.model_dump_json(indent=2))
    os.replace(staging, marker)  # the marker appears whole or not at all
    return folder


def remove_layout(
    root: Path, namespace: str, table: str, procedure_id: str, procedure_run: str
) -> bool:
    """Undo create_layout: remove the folder if this procedure's run made it."""
    folder = owned_table_folder(root, namespace, table)
    marker = folder / MARKER
    if marker.exists() and marked_maker(marker) != (procedure_id, procedure_run):
        return False
    if not folder.exists():
        return False
    shutil.rmtree(folder)
    remove_if_empty(folder.parent)
    return True


def delete_data(root: Path, namespace: str, table: str, created_by: str, created_run: str) -> bool:
    """Remove the folder of the table that `created_by`'s run `created_run` made (after the
    catalog dropped it).

    A folder whose marker names another creator is a table made again since (this delete
    is a retry or a zombie): it stays. The marker goes last, so a delete cut short and retried
    still finds it and finishes."""
    folder = owned_table_folder(root, namespace, table)
    marker = folder / MARKER
    if not marker.exists():
        # Emptied by an earlier try, or a new table's folder still without its marker.
        remove_if_empty(folder)
        remove_if_empty(folder.parent)
        return False
    if marked_maker(marker) != (created_by, created_run):
        return False
    for child in list(folder.iterdir()):
        if child == marker:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink(missing_ok=True)
    marker.unlink(missing_ok=True)
    remove_if_empty(folder)
    remove_if_empty(folder.parent)
    return True


def delete_listed_files(folder: Path, uris: list[str]) -> int:
    """Delete files an Iceberg snapshot listed (`file:` URIs), each only if it lies in the
    table's own folder (else OutsideTableFolder, and none is deleted); the number deleted now
    (a retry finds some gone already)."""
    base = folder.resolve()
    targets = []
    for uri in uris:
        path = local_path(uri)
        # Relative to the folder if it is in it; as given (refused by `inside`) if not.
        relative = path.relative_to(base).as_posix() if path.is_relative_to(base) else uri
        targets.append(inside(base, relative))
    deleted = 0
    for target in targets:
        if target.exists():
            target.unlink()
            deleted += 1
    return deleted


def remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty, or gone: either way nothing to do
        folder.rmdir()

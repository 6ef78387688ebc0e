"""A load's input, checked and then read once: the check resolves the path and finds it under
the folders this worker loads from; the job reads a copy made by opening the resolved path one
component at a time, from `/`, following no link. A link swapped in after the check (on the
path, or for a file of a folder) fails the open, so Spark never reads past the check.

The copy sits beside the attempt's output, in the table's staging folder, and is hard-linked
where it can be (the same file system, a file the worker owns), else copied.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from procbus.errors import InvalidRequest

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking: a FIFO swapped in opens at once, and is refused as no file by its fstat.
_ENTRY_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# What an open following no link fails with when a link (or a file for a folder) is there now.
_SWAPPED = (errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EMLINK)


def _inside(path: str, real_roots: Sequence[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(root) for root in real_roots)


def real_roots(roots: Sequence[Path]) -> list[Path]:
    return [Path(os.path.realpath(root)) for root in roots]


def allowed_source(source: str, roots: Sequence[Path]) -> Path:
    """`source` with every link and `..` resolved, when it lies under one of `roots` (a folder:
    with everything in it); else InvalidRequest, the same whether or not it exists."""
    if not os.path.isabs(source):
        raise InvalidRequest(f"the source {source!r} is not an absolute path")
    resolved_roots = real_roots(roots)
    if not _inside(source, resolved_roots):
        shown = ", ".join(str(root) for root in resolved_roots)
        raise InvalidRequest(
            f"the source {source} is not under a folder this worker loads from ({shown}): put "
            "the input there, or add its folder to the worker's PROCBUS_LOAD_ROOTS"
        )
    resolved = Path(os.path.realpath(source))
    if resolved.is_dir():
        # Spark reads what the folder holds: no link in it may lead out (nor loop).
        walked: set[str] = set()
        for folder, folders, files in os.walk(resolved, followlinks=True):
            if os.path.realpath(folder) in walked:
                folders[:] = []
                continue
            walked.add(os.path.realpath(folder))
            for name in (*folders, *files):
                if not _inside(os.path.join(folder, name), resolved_roots):
                    raise _leads_out(source)
    return resolved


def _leads_out(source: str) -> InvalidRequest:
    return InvalidRequest(
        f"the source {source} holds links that lead outside the folders this worker loads from"
    )


def _changed(source: str) -> InvalidRequest:
    return InvalidRequest(
        f"the source {source} changed while it was checked (a link, or another kind of file, "
        "took the place of part of it); nothing was loaded: load it again once it stays put"
    )


def open_parent(path: Path, source: str) -> int:
    """A descriptor of the folder holding `path` (absolute, with no link or `..` in it), opened
    one component at a time from `/` with O_NOFOLLOW: what it names is what lies at that very
    path now. A link on the path (swapped in since it was resolved): InvalidRequest."""
    if not path.is_absolute() or ".." in path.parts:
        raise InvalidRequest(f"the source {source} is no resolved absolute path")
    descriptor = os.open("/", _FOLDER_FLAGS)
    try:
        for name in path.parts[1:-1]:
            opened = os.open(name, _FOLDER_FLAGS, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = opened
    except OSError as error:
        os.close(descriptor)
        if error.errno in _SWAPPED:
            raise _changed(source) from None
        raise
    return descriptor


def open_entry(folder: int, name: str, source: str) -> int:
    """`name` in the open `folder`, following no link (one swapped in: InvalidRequest)."""
    try:
        return os.open(name, _ENTRY_FLAGS, dir_fd=folder)
    except OSError as error:
        if error.errno in _SWAPPED:
            raise _changed(source) from None
        raise


def stage_input(resolved: Path, roots: Sequence[Path], into: Path, source: str) -> Path:
    """Copy what `resolved` (from `allowed_source`) names into the new folder `into`, opening
    every file and folder following no link: the path the job reads then, which is `into`
    holding the source's own name. A link inside a folder is followed only to a file or folder
    under `roots`, itself opened from `/` again."""
    into.mkdir(parents=True)
    target = into / resolved.name
    _stage_path(resolved, target, real_roots(roots), source, walked=set())
    return target


def _stage_path(
    path: Path, target: Path, roots: list[Path], source: str, walked: set[tuple[int, int]]
) -> None:
    parent = open_parent(path, source)
    try:
        _stage_entry(parent, path.name, path, target, roots, source, walked)
    finally:
        os.close(parent)


def _stage_entry(
    parent: int,
    name: str,
    path: Path,
    target: Path,
    roots: list[Path],
    source: str,
    walked: set[tuple[int, int]],
) -> None:
    """Copy the entry `name` of the open folder `parent` (at `path`, resolved) to `target`."""
    descriptor = open_entry(parent, name, source)
    try:
        found = os.fstat(descriptor)
        if stat.S_ISREG(found.st_mode):
            _place_file(descriptor, parent, name, target)
        elif not stat.S_ISDIR(found.st_mode):
            raise InvalidRequest(f"the source {source} holds what is neither a file nor a folder")
        elif (found.st_dev, found.st_ino) not in walked:  # a loop back: Spark would not loop
            walked.add((found.st_dev, found.st_ino))
            target.mkdir()
            with os.scandir(descriptor) as entries:
                names = sorted((entry.name, entry.is_symlink()) for entry in entries)
            for entry, is_link in names:
                if not is_link:
                    _stage_entry(
                        descriptor, entry, path / entry, target / entry, roots, source, walked
                    )
                    continue
                linked = Path(os.path.realpath(path / entry))
                if not _inside(str(linked), roots):
                    raise _leads_out(source)
                _stage_path(linked, target / entry, roots, source, walked)
    finally:
        os.close(descriptor)


def _place_file(descriptor: int, parent: int, name: str, target: Path) -> None:
    """The open file (`name` in `parent`) at `target`: a hard link to it (no bytes copied)
    when its name still holds it, or else a copy of what was opened."""
    try:
        os.link(name, target, src_dir_fd=parent, follow_symlinks=False)
    except OSError as error:
        # Another file system, or a file the kernel will not link for this user.
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK):
            raise
    else:
        linked, opened = os.lstat(target), os.fstat(descriptor)
        if (linked.st_dev, linked.st_ino) == (opened.st_dev, opened.st_ino):
            return
        target.unlink()  # the name held another file (or a link) by then: copy what was opened
    with os.fdopen(os.dup(descriptor), "rb") as given, target.open("xb") as copy:
        given.seek(0)
        shutil.copyfileobj(given, copy, 1 << 20)

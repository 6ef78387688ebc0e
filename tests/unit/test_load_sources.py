"""A load's source, checked and then copied following no link (procbus.spark.sources), on real
files: what was checked is what is copied, or the copy is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from procbus.errors import InvalidRequest
from procbus.spark.sources import allowed_source, stage_input


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """A load root holding a file and a folder, and a secret beside it (outside the root)."""
    root, outside = tmp_path / "incoming", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.csv").write_text("id\n999\n")
    (root / "rows.csv").write_text("id\n1\n")
    (root / "batch").mkdir()
    (root / "batch" / "part-1.csv").write_text("id\n2\n")
    return root, outside


def tree(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): path.read_text()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_file_and_a_folder_are_copied_as_they_are(
    roots: tuple[Path, Path], tmp_path: Path
) -> None:
    root, _ = roots
    (root / "batch" / "nested").mkdir()
    (root / "batch" / "nested" / "part-2.csv").write_text("id\n3\n")
    (root / "batch" / "same.csv").symlink_to(root / "rows.csv")  # a link inside the roots
    (root / "batch" / "again").symlink_to(root / "batch")  # a loop: copied once
    copied = stage_input(
        allowed_source(str(root / "rows.csv"), [root]), [root], tmp_path / "a.input", "S"
    )
    assert copied == tmp_path / "a.input" / "rows.csv" and copied.read_text() == "id\n1\n"
    # The same file system and the worker's own file: a hard link, no byte copied.
    assert copied.stat().st_ino == (root / "rows.csv").stat().st_ino
    folder = stage_input(
        allowed_source(str(root / "batch"), [root]), [root], tmp_path / "b.input", "S"
    )
    assert tree(folder) == {
        "nested/part-2.csv": "id\n3\n",
        "part-1.csv": "id\n2\n",
        "same.csv": "id\n1\n",
    }
    assert not any(path.is_symlink() for path in folder.rglob("*"))


@pytest.mark.parametrize(
    ("loaded", "swapped"),
    [
        ("rows.csv", "rows.csv"),  # the file itself
        ("batch", "batch"),  # the folder itself
        ("batch", "batch/part-1.csv"),  # a file of the folder
        ("batch/part-1.csv", "batch"),  # a folder on the path
    ],
)
def test_a_link_swapped_in_after_the_check_is_refused(
    roots: tuple[Path, Path], tmp_path: Path, loaded: str, swapped: str
) -> None:
    """The source checked, then a part of it swapped for a link to the secret: the copy is
    refused, and holds nothing of the secret."""
    root, outside = roots
    source = root / loaded
    resolved = allowed_source(str(source), [root])
    path = root / swapped
    path.rename(path.with_name(f"{path.name}.checked"))
    path.symlink_to(outside / "secret.csv" if path.suffix else outside)
    with pytest.raises(
        InvalidRequest, match="changed while it was checked|holds links that lead outside"
    ):
        stage_input(resolved, [root], tmp_path / "copy.input", str(source))
    assert "999" not in "".join(tree(tmp_path / "copy.input").values())


def test_a_link_out_added_after_the_check_is_refused(
    roots: tuple[Path, Path], tmp_path: Path
) -> None:
    root, outside = roots
    resolved = allowed_source(str(root / "batch"), [root])
    (root / "batch" / "part-2.csv").symlink_to(outside / "secret.csv")
    with pytest.raises(InvalidRequest, match="holds links that lead outside"):
        stage_input(resolved, [root], tmp_path / "copy.input", "SOURCE")


def test_a_fifo_is_refused_without_blocking(roots: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = roots
    os.mkfifo(root / "batch" / "pipe.csv")  # opened for reading, it would wait for a writer
    with pytest.raises(InvalidRequest, match="neither a file nor a folder"):
        stage_input(allowed_source(str(root / "batch"), [root]), [root], tmp_path / "c.input", "S")


def test_a_file_on_another_file_system_is_copied(roots: tuple[Path, Path]) -> None:
    """/dev/shm is a tmpfs of its own: no hard link reaches it, the bytes are copied."""
    root, _ = roots
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(root).st_dev:
        pytest.skip("no second file system here to copy across")
    into = shm / f"procbus-test-{os.getpid()}-{id(root)}.input"
    try:
        copied = stage_input(allowed_source(str(root / "rows.csv"), [root]), [root], into, "S")
        assert copied.read_text() == "id\n1\n"
        assert copied.stat().st_ino != (root / "rows.csv").stat().st_ino
    finally:
        for path in sorted(into.rglob("*"), reverse=True):
            path.unlink()
        into.rmdir()

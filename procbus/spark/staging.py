"""Where a job attempt's output lives before and after its commit, under the table's folder:

    <table>/_staging/<attempt token>/<copy of col=value>/part-....parquet  written by the job
    <table>/_staging/<attempt token>.input/<the source's name>            what a load reads
    <table>/data/<col=value>/<attempt token>-part-....parquet              moved there to commit

Every attempt writes to its own staging folder (Spark's committer keeps `_temporary` inside the
output folder, so two attempts must never share one). Files under data/ are visible only once a
catalog snapshot lists them; a file there whose attempt never committed is removed by name (its
token prefix) when that attempt is discarded.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

from procbus.errors import needs_extra
from procbus.lakehouse.data import DataFile
from procbus.lakehouse.warehouse import DATA_FOLDER, OutsideTableFolder, inside, remove_if_empty
from procbus.spark.frames import PARTITION_COPY_PREFIX
from procbus.spark.specs import outcome_file, spec_file

STAGING_FOLDER = "_staging"
# An attempt token names a folder and prefixes file names: never a path of its own.
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def checked_token(attempt_token: str) -> str:
    if not _TOKEN.fullmatch(attempt_token):
        raise OutsideTableFolder(
            f"refused to remove files: {attempt_token!r} is no attempt token (letters, digits, "
            "'_' and '-'); nothing was removed"
        )
    return attempt_token


def staging_folder(table_folder: Path, attempt_token: str) -> Path:
    return table_folder / STAGING_FOLDER / attempt_token


def input_folder(table_folder: Path, attempt_token: str) -> Path:
    """Where a load attempt's copy of its input lies, beside its output (Spark's writer wants
    the output folder new)."""
    return table_folder / STAGING_FOLDER / f"{checked_token(attempt_token)}.input"


def remove_input(table_folder: Path, attempt_token: str) -> None:
    shutil.rmtree(input_folder(table_folder, attempt_token), ignore_errors=True)


def collect_output(table_folder: Path, attempt_token: str) -> list[DataFile]:
    """The Parquet files an attempt wrote, as they will be named in the catalog: partition from
    the Hive folder names, rows from each file's footer, bytes from the file."""
    # pyarrow loads only where table files are read: importing this module stays cheap.
    with needs_extra("spark"):
        import pyarrow.parquet as parquet

    staging = staging_folder(table_folder, attempt_token)
    files: list[DataFile] = []
    for written in sorted(staging.rglob("*.parquet")):
        relative = written.relative_to(staging)
        folders = [part.removeprefix(PARTITION_COPY_PREFIX) for part in relative.parts[:-1]]
        partition = dict(
            (unquote(name), unquote(value))
            for name, _, value in (part.partition("=") for part in folders)
        )
        final = Path(DATA_FOLDER, *folders, f"{attempt_token}-{relative.name}")
        files.append(
            DataFile(
                path=final.as_posix(),
                partition=partition,
                records=parquet.ParquetFile(written).metadata.num_rows,
                bytes=written.stat().st_size,
            )
        )
    return files


def publish_files(table_folder: Path, attempt_token: str, files: list[DataFile]) -> None:
    """Move staged files to their names under data/ (still invisible: no snapshot lists them).
    Idempotent: a file moved by an earlier try is left as it is."""
    staging = staging_folder(table_folder, checked_token(attempt_token))
    finals = [inside(table_folder, file.path, DATA_FOLDER) for file in files]
    for file, final in zip(files, finals, strict=True):
        relative = Path(file.path).relative_to(DATA_FOLDER)
        folders = [f"{PARTITION_COPY_PREFIX}{part}" for part in relative.parent.parts]
        staged = staging.joinpath(*folders, relative.name.removeprefix(f"{attempt_token}-"))
        if staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
        elif not final.exists():
            raise FileNotFoundError(f"staged file {staged} is gone and was never moved to {final}")


def remove_staging(table_folder: Path, attempt_token: str) -> None:
    staged = staging_folder(table_folder, checked_token(attempt_token))
    inside(table_folder, staged.relative_to(table_folder).as_posix(), STAGING_FOLDER)
    # The spec first: a cluster driver still running finds it gone and removes what it wrote.
    spec_file(str(staged)).unlink(missing_ok=True)
    shutil.rmtree(staged, ignore_errors=True)
    outcome_file(str(staged)).unlink(missing_ok=True)  # a cluster driver's
    remove_input(table_folder, attempt_token)
    remove_if_empty(table_folder / STAGING_FOLDER)  # other attempts' folders may remain


def discard_attempt(table_folder: Path, attempt_token: str) -> int:
    """Remove everything an uncommitted attempt wrote: its staging folder and any of its files
    already moved under data/. The number of files removed from data/."""
    remove_staging(table_folder, attempt_token)
    data = table_folder / DATA_FOLDER
    moved = list(data.rglob(f"{attempt_token}-*")) if data.exists() else []
    targets = [
        inside(table_folder, path.relative_to(table_folder).as_posix(), DATA_FOLDER)
        for path in moved
    ]
    for target in targets:
        target.unlink(missing_ok=True)
    return len(targets)


def delete_files(table_folder: Path, paths: list[str]) -> int:
    """Delete replaced files (a retry finds some gone already); the number deleted now. Each
    must lie under the table's data/ folder: else OutsideTableFolder, and none is deleted."""
    targets = [inside(table_folder, path, DATA_FOLDER) for path in paths]
    deleted = 0
    for target in targets:
        if target.exists():
            target.unlink()
            deleted += 1
        if target.parent != table_folder / DATA_FOLDER:
            remove_if_empty(target.parent)  # an emptied partition folder goes too
    return deleted
